//! The only module that knows Redis: the connection, the Lua scripts from `lua/`, the key
//! layout, and parsing replies into domain types. Everything above it speaks in terms of
//! policies, identifiers and decisions.

mod error;

pub use error::StoreError;

use std::time::Duration;

use redis::{Script, aio::ConnectionManager};

/// Lua scripts, loaded from `lua/` at compile time and run with EVALSHA (the `redis` crate
/// falls back to loading the script when Redis answers NOSCRIPT).
struct Scripts {
    health: Script,
}

impl Scripts {
    fn load() -> Self {
        Self { health: Script::new(include_str!("../../lua/health.lua")) }
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

/// A handle on Redis; cheap to clone (one multiplexed connection shared by all clones).
#[derive(Clone)]
pub struct Store {
    conn: ConnectionManager,
    scripts: std::sync::Arc<Scripts>,
    timeout: Duration,
}

impl Store {
    /// Connects to `url`. Reconnection after a failure is automatic.
    pub async fn connect(url: &str, timeout: Duration) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_with_config(client, config).await?;
        Ok(Self { conn, scripts: std::sync::Arc::new(Scripts::load()), timeout })
    }

    /// Runs the health script: Redis is up and executes Lua.
    pub async fn health(&self) -> Result<RedisHealth, StoreError> {
        let started = std::time::Instant::now();
        let mut conn = self.conn.clone();
        let (secs, micros): (i64, i64) = self
            .with_timeout(self.scripts.health.prepare_invoke().invoke_async(&mut conn))
            .await?;
        Ok(RedisHealth {
            server_time_us: secs * 1_000_000 + micros,
            round_trip_us: started.elapsed().as_micros() as u64,
        })
    }

    async fn with_timeout<T>(
        &self,
        fut: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}
