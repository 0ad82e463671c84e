//! The only module that knows Redis: the connection, the Lua scripts from `lua/`, the key
//! layout, and parsing replies into domain types. Everything above it speaks in terms of
//! policies, identifiers and decisions.

mod error;
pub mod keys;

pub use error::StoreError;
pub use keys::Keys;

use std::{sync::Arc, time::Duration};

use redis::{Script, aio::ConnectionManager};

use crate::domain::{Algorithm, Decision, Identifier, Name, Outcome, Rule, RuleResult};

/// Lua scripts, loaded from `lua/` at compile time and run with EVALSHA (the `redis` crate
/// loads a script again when Redis answers NOSCRIPT, e.g. after SCRIPT FLUSH or a restart).
struct Scripts {
    health: Script,
    check: Script,
}

impl Scripts {
    fn load() -> Self {
        // One script for every mix of algorithms: the shared prelude, one file per
        // algorithm, then the driver that reads KEYS and ARGV.
        let check = [
            include_str!("../../lua/prelude.lua"),
            include_str!("../../lua/fixed_window.lua"),
            include_str!("../../lua/sliding_log.lua"),
            include_str!("../../lua/sliding_window.lua"),
            include_str!("../../lua/token_bucket.lua"),
            include_str!("../../lua/leaky_bucket.lua"),
            include_str!("../../lua/gcra.lua"),
            include_str!("../../lua/bucketed_window.lua"),
            include_str!("../../lua/check.lua"),
        ]
        .join("\n");
        Self { health: Script::new(include_str!("../../lua/health.lua")), check: Script::new(&check) }
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

/// Which clock a check runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Now {
    /// Redis `TIME`: the server's clock, the same for every Spillway host. Production.
    Redis,
    /// A fixed time in µs (tests that replay published tables).
    At(i64),
    /// Redis `TIME` plus an offset in µs: a test clock that never runs slower than the
    /// real one, so real TTLs never expire state the test still counts on.
    RedisPlus(i64),
}

impl Now {
    fn arg(self) -> String {
        match self {
            Now::Redis => String::new(),
            Now::At(us) => us.to_string(),
            Now::RedisPlus(us) => format!("+{us}"),
        }
    }
}

/// One rule × identifier to evaluate in a check.
#[derive(Clone, Copy, Debug)]
pub struct CheckEntry<'a> {
    pub rule: &'a Rule,
    pub identifier: &'a Identifier,
}

/// The raw answer of the check script, before it is named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptReply {
    pub allowed: bool,
    /// The time the script used, µs on Redis's clock.
    pub now_us: i64,
    pub outcomes: Vec<Outcome>,
}

/// A handle on Redis; cheap to clone (one multiplexed connection shared by all clones).
#[derive(Clone)]
pub struct Store {
    conn: ConnectionManager,
    scripts: Arc<Scripts>,
    keys: Keys,
    timeout: Duration,
}

impl Store {
    /// Connects to `url`. Reconnection after a failure is automatic.
    pub async fn connect(url: &str, timeout: Duration) -> Result<Self, StoreError> {
        Self::connect_with_keys(url, timeout, Keys::default()).await
    }

    /// Connects with keys under their own namespace (tests use one per test).
    pub async fn connect_with_keys(url: &str, timeout: Duration, keys: Keys) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_with_config(client, config).await?;
        Ok(Self { conn, scripts: Arc::new(Scripts::load()), keys, timeout })
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
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

    /// Checks `entries` of `policy` at `cost`, consuming only when every one allows, in one
    /// round trip, on the clock `now` (`Now::Redis` in production).
    pub async fn check_and_consume(
        &self,
        policy: &Name,
        entries: &[CheckEntry<'_>],
        cost: u64,
        now: Now,
    ) -> Result<Decision, StoreError> {
        let keys: Vec<String> = entries
            .iter()
            .map(|e| self.keys.rule_state(policy, e.identifier, &e.rule.name, &e.rule.algorithm))
            .collect();
        let rules: Vec<(Algorithm, bool)> =
            entries.iter().map(|e| (e.rule.algorithm, e.rule.count_denied)).collect();
        let reply = self.run_check(&keys, &rules, cost, now).await?;
        let results = entries
            .iter()
            .zip(reply.outcomes)
            .map(|(e, outcome)| RuleResult {
                rule: e.rule.name.clone(),
                identifier: e.identifier.clone(),
                algorithm: e.rule.algorithm.name().to_owned(),
                outcome,
                binding: false,
            })
            .collect();
        Ok(Decision::new(results))
    }

    /// Runs the check script on explicit keys. The building block of `check_and_consume`,
    /// public so the tests can drive each algorithm against its reference model.
    pub async fn run_check(
        &self,
        keys: &[String],
        rules: &[(Algorithm, bool)],
        cost: u64,
        now: Now,
    ) -> Result<ScriptReply, StoreError> {
        if keys.is_empty() {
            return Ok(ScriptReply { allowed: true, now_us: 0, outcomes: vec![] });
        }
        let mut invocation = self.scripts.check.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        invocation.arg(now.arg()).arg(cost);
        for (algorithm, count_denied) in rules {
            let (p1, p2, p3) = params(algorithm);
            invocation.arg(keys::algorithm_code(algorithm)).arg(if *count_denied { "1" } else { "0" });
            invocation.arg(p1).arg(p2).arg(p3);
        }
        let mut conn = self.conn.clone();
        let raw: Vec<i64> = self.with_timeout(invocation.invoke_async(&mut conn)).await?;
        parse_reply(&raw, keys.len())
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

/// The three numeric parameters each algorithm takes in ARGV, in its file's order.
fn params(algorithm: &Algorithm) -> (u64, u64, u64) {
    match *algorithm {
        Algorithm::FixedWindow { limit, window_ms }
        | Algorithm::SlidingLog { limit, window_ms }
        | Algorithm::SlidingWindow { limit, window_ms } => (limit, window_ms, 0),
        Algorithm::TokenBucket { capacity, refill_tokens, refill_period_ms } => {
            (capacity, refill_tokens, refill_period_ms)
        }
        Algorithm::LeakyBucket { capacity, leak_tokens, leak_period_ms } => {
            (capacity, leak_tokens, leak_period_ms)
        }
        Algorithm::Gcra { rate, period_ms, burst } => (rate, period_ms, burst),
        Algorithm::BucketedWindow { limit, window_ms, bucket_ms } => (limit, window_ms, bucket_ms),
    }
}

fn parse_reply(raw: &[i64], entries: usize) -> Result<ScriptReply, StoreError> {
    if raw.len() != 2 + 6 * entries {
        return Err(StoreError::Reply(format!(
            "check.lua answered {} integers for {entries} entries",
            raw.len()
        )));
    }
    let nonneg = |v: i64, what: &str| -> Result<u64, StoreError> {
        u64::try_from(v).map_err(|_| StoreError::Reply(format!("negative {what}: {v}")))
    };
    let outcomes = raw[2..]
        .chunks_exact(6)
        .map(|c| {
            Ok(Outcome {
                allowed: c[0] == 1,
                limit: nonneg(c[1], "limit")?,
                remaining: nonneg(c[2], "remaining")?,
                reset_ms: nonneg(c[3], "reset_ms")?,
                retry_after_ms: if c[4] < 0 { None } else { Some(c[4] as u64) },
                delay_ms: nonneg(c[5], "delay_ms")?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(ScriptReply { allowed: raw[0] == 1, now_us: raw[1], outcomes })
}
