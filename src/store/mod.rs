//! The only module that knows Redis; everything above it speaks in terms of policies,
//! identifiers and decisions. This file holds the connection (one Redis or a Cluster), its
//! timeouts and circuit breaker, and the registry of Lua scripts from `lua/`. A check's way
//! through Redis is `check.rs` (script, arguments, call, reply) and `coalesce.rs` (checks
//! sent together); the other files each keep one concern's keys (policies, people,
//! sessions, history, alerts, audit, leases, the overview's counters).

pub mod alerts;
mod audit;
mod backup;
mod breaker;
mod check;
mod coalesce;
mod error;
pub mod events;
pub mod history;
pub mod keys;
pub mod leases;
pub mod people;
pub mod policies;
mod record;
mod sentinel;
pub mod sessions;
pub mod stats;
pub mod streaks;

pub(crate) use check::CheckContext;
pub use check::{CheckEntry, Now, ScriptReply};
use check::{CheckScripts, entry_args, parse_reply, penalty_keys, penalty_offsets};
pub use error::StoreError;
pub use events::Event;
pub use keys::Keys;
pub use policies::Saved;
pub use record::{KEEP_MS as RECORD_KEEP_MS, RATE_PERIOD_MS as RECORD_RATE_PERIOD_MS};

use std::{sync::Arc, time::Duration};

use redis::{
    FromRedisValue, Script, ScriptInvocation, aio::ConnectionManager,
    cluster_async::ClusterConnection,
};

/// Lua scripts, loaded from `lua/` at compile time and run with EVALSHA (the `redis` crate
/// loads a script again when Redis answers NOSCRIPT, e.g. after SCRIPT FLUSH or a restart).
struct Scripts {
    health: Script,
    checks: CheckScripts,
    policy_save: Script,
    policy_import: Script,
    session_touch: Script,
    stats_flush: Script,
    stats_detail: Script,
    streaks: Script,
    companions: Script,
    alerts_lease: Script,
    leases: Script,
    reset: Script,
    reset_undo: Script,
}

impl Scripts {
    fn load() -> Self {
        Self {
            health: Script::new(include_str!("../../lua/health.lua")),
            checks: CheckScripts::new(),
            policy_save: policies::save_script(),
            policy_import: policies::import_script(),
            session_touch: sessions::touch_script(),
            alerts_lease: Script::new(include_str!("../../lua/alerts_lease.lua")),
            leases: leases::script(),
            stats_detail: Script::new(include_str!("../../lua/stats_detail.lua")),
            streaks: Script::new(include_str!("../../lua/streaks.lua")),
            companions: Script::new(include_str!("../../lua/companions.lua")),
            reset: Script::new(include_str!("../../lua/reset.lua")),
            reset_undo: Script::new(include_str!("../../lua/reset_undo.lua")),
            stats_flush: Script::new(
                &[
                    include_str!("../../lua/stats.lua"),
                    include_str!("../../lua/stats_flush.lua"),
                ]
                .join("\n"),
            ),
        }
    }
}

/// What the readiness probe learned about Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisHealth {
    /// Redis server time, microseconds since the epoch.
    pub server_time_us: i64,
    /// How long the probe took, in microseconds.
    pub round_trip_us: u64,
}

/// One Redis server, or a Redis Cluster.
#[derive(Clone)]
enum Backend {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// One master at a time, as the sentinels name it.
    Sentinel(Arc<sentinel::SentinelLink>),
}

/// Every command goes to whichever connection the store has: the one place that tells a
/// single Redis from a Cluster when sending.
impl redis::aio::ConnectionLike for Backend {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Backend::Single(conn) => conn.req_packed_command(cmd),
            Backend::Cluster(conn) => conn.req_packed_command(cmd),
            Backend::Sentinel(link) => {
                let (link, mut conn) = (link.clone(), link.conn());
                Box::pin(async move {
                    let answer = conn.req_packed_command(cmd).await;
                    if let Err(error) = &answer {
                        link.command_failed(error);
                    }
                    answer
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Backend::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Backend::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
            Backend::Sentinel(link) => {
                let (link, mut conn) = (link.clone(), link.conn());
                Box::pin(async move {
                    let answer = conn.req_packed_commands(pipeline, offset, count).await;
                    if let Err(error) = &answer {
                        link.command_failed(error);
                    }
                    answer
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Backend::Single(conn) => conn.get_db(),
            Backend::Cluster(conn) => conn.get_db(),
            Backend::Sentinel(link) => link.conn().get_db(),
        }
    }
}

/// A handle on Redis; cheap to clone (one multiplexed connection shared by all clones).
#[derive(Clone)]
pub struct Store {
    backend: Backend,
    /// For pub/sub, which needs a connection of its own (single Redis only).
    client: Option<redis::Client>,
    scripts: Arc<Scripts>,
    keys: Keys,
    timeout: Duration,
    /// What a policy write may take ([`write_timeout`]).
    write_timeout: Duration,
    breaker: Arc<breaker::Breaker>,
    /// Single Redis: the queue that coalesces concurrent counted checks into one call.
    coalescer: Option<Arc<coalesce::Coalescer>>,
}

impl Store {
    /// The Redis the configuration names: a cluster, or one server (with a private CA for
    /// `rediss://` when `REDIS_CA_CERT` is set). The server and the command line both connect
    /// here; `timeout` bounds each check's call.
    pub async fn connect_configured(
        config: &crate::config::Config,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let keys = Keys::new(format!("{}spw", config.redis_key_prefix));
        if !config.redis_cluster_urls.is_empty() {
            return Self::connect_cluster(&config.redis_cluster_urls, timeout, keys).await;
        }
        let read = |name: &str, path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|e| StoreError::Setup(format!("{name} {}: {e}", path.display())))
        };
        let ca = match &config.redis_ca_cert {
            Some(path) => Some(read("REDIS_CA_CERT", path)?),
            None => None,
        };
        let client = match &config.redis_client_cert {
            Some((cert, key)) => Some(redis::ClientTlsConfig {
                client_cert: read("REDIS_CLIENT_CERT", cert)?,
                client_key: read("REDIS_CLIENT_KEY", key)?,
            }),
            None => None,
        };
        let tls = (ca.is_some() || client.is_some()).then_some(redis::TlsCertificates {
            client_tls: client,
            root_cert: ca,
        });
        if let Some(settings) = &config.redis_sentinel {
            return Self::connect_sentinel(settings, tls, timeout, keys).await;
        }
        Self::connect_tls(&config.redis_url, tls, timeout, keys).await
    }

    /// Connects to `url`. Reconnection after a failure is automatic.
    pub async fn connect(url: &str, timeout: Duration) -> Result<Self, StoreError> {
        Self::connect_with_keys(url, timeout, Keys::default()).await
    }

    /// Connects with keys under their own namespace (tests use one per test).
    pub async fn connect_with_keys(
        url: &str,
        timeout: Duration,
        keys: Keys,
    ) -> Result<Self, StoreError> {
        Self::connect_tls(url, None, timeout, keys).await
    }

    /// Connects to `url`; for `rediss://`, `tls` may name the CA to trust instead of the
    /// system's trust store, and the certificate to show Redis (`tls-auth-clients yes`).
    pub async fn connect_tls(
        url: &str,
        tls: Option<redis::TlsCertificates>,
        timeout: Duration,
        keys: Keys,
    ) -> Result<Self, StoreError> {
        crate::install_tls_provider();
        let client = match tls {
            Some(certificates) => redis::Client::build_with_tls(url, certificates)?,
            None => redis::Client::open(url)?,
        };
        let pubsub_client = client.clone();
        let conn = ConnectionManager::new_with_config(client, manager_config(timeout)).await?;
        Ok(Self::single(
            Backend::Single(conn),
            Some(pubsub_client),
            timeout,
            keys,
        ))
    }

    /// Connects to the master the sentinels of `settings` name, and follows it through a
    /// failover (see `sentinel.rs`); `tls` as for [`Store::connect_tls`].
    pub async fn connect_sentinel(
        settings: &crate::config::sentinel::SentinelSettings,
        tls: Option<redis::TlsCertificates>,
        timeout: Duration,
        keys: Keys,
    ) -> Result<Self, StoreError> {
        crate::install_tls_provider();
        let link = sentinel::SentinelLink::connect(settings, tls, manager_config(timeout)).await?;
        Ok(Self::single(Backend::Sentinel(link), None, timeout, keys))
    }

    /// A store of one Redis at a time (a server, or Sentinel's master), with its coalescer.
    fn single(
        backend: Backend,
        pubsub_client: Option<redis::Client>,
        timeout: Duration,
        keys: Keys,
    ) -> Self {
        let mut store = Self::over(backend, pubsub_client, timeout, keys);
        store.coalescer = Some(Arc::new(coalesce::Coalescer::start(store.clone())));
        store
    }

    /// A store over `backend`, without a coalescer yet.
    fn over(
        backend: Backend,
        pubsub_client: Option<redis::Client>,
        timeout: Duration,
        keys: Keys,
    ) -> Self {
        Self {
            backend,
            client: pubsub_client,
            scripts: Arc::new(Scripts::load()),
            keys,
            timeout,
            write_timeout: write_timeout(timeout),
            breaker: Arc::new(breaker::Breaker::new(Duration::from_millis(500))),
            coalescer: None,
        }
    }

    /// Connects to a Redis Cluster through any of `urls`.
    pub async fn connect_cluster(
        urls: &[String],
        timeout: Duration,
        keys: Keys,
    ) -> Result<Self, StoreError> {
        crate::install_tls_provider();
        let client = redis::cluster::ClusterClient::builder(urls.to_vec())
            .response_timeout(write_timeout(timeout))
            .connection_timeout(Duration::from_secs(2))
            .retries(2)
            .build()?;
        let conn = client.get_async_connection().await?;
        Ok(Self::over(Backend::Cluster(conn), None, timeout, keys))
    }

    /// Whether the circuit breaker is refusing calls (Redis failed repeatedly just now).
    pub fn circuit_open(&self) -> bool {
        self.breaker.is_open()
    }

    /// Whether this store talks to one Redis server at a time (a server, or Sentinel's
    /// master): pub/sub is available.
    pub fn is_single(&self) -> bool {
        matches!(self.backend, Backend::Single(_) | Backend::Sentinel(_))
    }

    /// A client of the Redis that pub/sub subscribes on: the server, or the master the
    /// sentinels name now (after a failover, a new subscription goes to the new one).
    pub(crate) fn pubsub_client(&self) -> Option<redis::Client> {
        match &self.backend {
            Backend::Sentinel(link) => Some(link.client()),
            _ => self.client.clone(),
        }
    }

    /// Whether this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.backend, Backend::Cluster(_))
    }

    async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        let mut conn = self.backend.clone();
        self.with_timeout(cmd.query_async(&mut conn)).await
    }

    /// A read that a change depends on (the version it replaces), within the write
    /// timeout and past the breaker, as the write itself ([`Store::invoke_write`]).
    async fn query_for_write<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        let mut conn = self.backend.clone();
        match tokio::time::timeout(self.write_timeout, cmd.query_async(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout(self.write_timeout)),
        }
    }

    /// A pipeline that changes what people configured (alert rules), as
    /// [`Store::query_for_write`].
    async fn query_pipe_for_write<T: FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, StoreError> {
        let mut conn = self.backend.clone();
        match tokio::time::timeout(self.write_timeout, pipe.query_async(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout(self.write_timeout)),
        }
    }

    async fn query_pipe<T: FromRedisValue>(&self, pipe: &redis::Pipeline) -> Result<T, StoreError> {
        let mut conn = self.backend.clone();
        self.with_timeout(pipe.query_async(&mut conn)).await
    }

    async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let mut conn = self.backend.clone();
        self.with_timeout(invocation.invoke_async(&mut conn)).await
    }

    /// Runs `cmd`, an EVALSHA of `script`; when Redis has lost the script (a restart, SCRIPT
    /// FLUSH), loads it and runs `cmd` again. One call for the breaker and the timeout, as a
    /// `ScriptInvocation` is: a NOSCRIPT on its own must not count as Redis failing, or after a
    /// restart the breaker would refuse the very load that cures it.
    async fn evalsha<T: FromRedisValue>(
        &self,
        script: &Script,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        let mut conn = self.backend.clone();
        self.with_timeout(async move {
            match cmd.query_async(&mut conn).await {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    script.load_async(&mut conn).await?;
                    cmd.query_async(&mut conn).await
                }
                other => other,
            }
        })
        .await
    }

    /// One call of the check script, traced (with traces on) as a span that links the
    /// checks it carried (`carried`: the spans of the traced ones).
    async fn traced_script_call<T>(
        carried: &[opentelemetry::trace::SpanContext],
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let span = crate::telemetry::traces::client_call(
            carried,
            "redis check.lua",
            &[
                ("db.system.name", "redis"),
                ("db.operation.name", "EVALSHA"),
            ],
        );
        crate::telemetry::traces::within_call(span, call).await
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Runs the health script: Redis is up and executes Lua.
    pub async fn health(&self) -> Result<RedisHealth, StoreError> {
        let started = std::time::Instant::now();
        let (secs, micros): (i64, i64) = self.invoke(&self.scripts.health.prepare_invoke()).await?;
        Ok(RedisHealth {
            server_time_us: secs * 1_000_000 + micros,
            round_trip_us: started.elapsed().as_micros() as u64,
        })
    }

    /// Runs a script that changes policies, within the write timeout: a large document
    /// (an Envoy domain of thousands of descriptors) may take Redis longer than a check's
    /// timeout, and a write that timed out here was often applied all the same, answered
    /// 503 and never audited. Past the circuit breaker: a person's save is rare and may
    /// wait out a stall the breaker opened for (the breaker keeps checks from piling up).
    async fn invoke_write<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let mut conn = self.backend.clone();
        match tokio::time::timeout(self.write_timeout, invocation.invoke_async(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout(self.write_timeout)),
        }
    }

    /// Every Redis call goes through here: the circuit breaker, then the timeout.
    async fn with_timeout<T>(
        &self,
        fut: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        if !self.breaker.allow() {
            return Err(StoreError::CircuitOpen);
        }
        let started = self.breaker.started();
        let result = match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        };
        match &result {
            Ok(_) => self.breaker.success(started),
            // A script error is Redis answering: the connection is fine.
            Err(StoreError::Redis(e))
                if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) => {}
            Err(_) => self.breaker.failure(started),
        }
        result
    }
}

/// One Redis's connection settings: the connection waits as long as a write may take; each
/// call's own timeout (`with_timeout`) is what bounds a check.
fn manager_config(timeout: Duration) -> redis::aio::ConnectionManagerConfig {
    redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(write_timeout(timeout)))
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_number_of_retries(1)
}

/// How long a policy write may take: the check timeout, and at least 5 s.
fn write_timeout(timeout: Duration) -> Duration {
    timeout.max(Duration::from_secs(5))
}
