//! Configuration, read once at startup from the environment and `Leptos.toml`, and
//! validated before anything connects. Secrets are never logged.

use std::{path::Path, time::Duration};

use leptos::config::LeptosOptions;

pub mod capacity;
pub mod sentinel;
pub mod upstream;
pub mod xds;

mod readers;
use readers::*;

/// The first admin of a Redis with no users: its password from a Secret
/// (`SPILLWAY_FIRST_ADMIN_PASSWORD`), or a random one shown on the terminal, or written to
/// `password_file` (`SPILLWAY_FIRST_ADMIN_PASSWORD_FILE`, default
/// `$TMPDIR/spillway-first-admin-password`, mode 0600) when there is no terminal.
#[derive(Clone)]
pub struct FirstAdmin {
    pub password: Option<String>,
    pub password_file: std::path::PathBuf,
}

/// Everything the server needs to start. Not `Debug`: it holds API keys.
#[derive(Clone)]
pub struct Config {
    /// Where to serve and where the compiled site lives.
    pub leptos_options: LeptosOptions,
    /// The Redis to use (`redis://` or `rediss://`).
    pub redis_url: String,
    /// PEM file of the CA that signed Redis's TLS certificate (`REDIS_CA_CERT`), when it
    /// is not in the system's trust store.
    pub redis_ca_cert: Option<std::path::PathBuf>,
    /// PEM files of the certificate and key shown to Redis over TLS (`REDIS_CLIENT_CERT`,
    /// `REDIS_CLIENT_KEY`), for a Redis that asks clients for one (`tls-auth-clients yes`).
    pub redis_client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// Put before every Redis key Spillway writes (`SPILLWAY_KEY_PREFIX`, which upstream's
    /// `CACHE_KEY_PREFIX` sets; default none): deployments sharing a Redis keep apart.
    pub redis_key_prefix: String,
    /// Seed nodes of a Redis Cluster; when set, used instead of `redis_url`.
    pub redis_cluster_urls: Vec<String>,
    /// Redis behind Sentinel; when set, used instead of `redis_url`.
    pub redis_sentinel: Option<sentinel::SentinelSettings>,
    /// How long one Redis operation may take before it counts as failed.
    pub redis_timeout: Duration,
    /// Longest time any HTTP request may take.
    pub request_timeout: Duration,
    /// Longest a connection may take to send a request's header, or sit idle between
    /// requests (`SPILLWAY_HEADER_READ_TIMEOUT_MS`, default 10 s).
    pub header_read_timeout: Duration,
    /// Connections each listener (HTTP, gRPC) holds open at most
    /// (`SPILLWAY_MAX_CONNECTIONS`, default from the memory budget: see [`capacity`]); past
    /// it a new one waits in the kernel's backlog until one closes.
    pub max_connections: usize,
    /// Calls each port has begun and not yet read the message of
    /// (`SPILLWAY_MAX_PENDING_CALLS`, default from the memory budget); past it a new call is
    /// refused at once.
    pub max_pending: usize,
    /// Denied requests held at once by policies that wait (`on_deny: wait`), on this
    /// instance (`SPILLWAY_MAX_WAITING`, default a quarter of the connections, at most half);
    /// past it a denial is answered at once.
    pub max_waiting: usize,
    /// Where the caps above came from, and what was lowered to fit the descriptors.
    pub capacity: capacity::Capacity,
    /// The first admin's password, and where a generated one is written.
    pub first_admin: FirstAdmin,
    /// The reverse proxies whose `X-Forwarded-*` headers are believed
    /// (`SPILLWAY_TRUSTED_PROXIES`, addresses and CIDR blocks; default none).
    pub trusted_proxies: crate::net::forwarded::TrustedProxies,
    /// `json` for structured logs, anything else for human-readable ones.
    pub log_format: LogFormat,
    /// Keys that may call the check endpoints (`SPILLWAY_SERVICE_KEYS`, comma-separated).
    pub service_keys: Vec<String>,
    /// Keys that act as admins (`SPILLWAY_ADMIN_KEYS`, comma-separated).
    pub admin_keys: Vec<String>,
    /// Forward-auth: which request header carries which dimension
    /// (`SPILLWAY_FORWARD_AUTH_IDENTIFIERS`, default `ip=X-Forwarded-For`).
    pub forward_auth_identifiers: Vec<(String, String)>,
    /// Forward-auth: the status of a denial (`SPILLWAY_FORWARD_AUTH_DENY_STATUS`, default
    /// 429; nginx's auth_request wants 403).
    pub forward_auth_deny_status: u16,
    /// How long to keep serving (with `Connection: close`) after SIGTERM before closing the
    /// listener (`SPILLWAY_SHUTDOWN_DRAIN_MS`, default 1000).
    pub shutdown_drain: Duration,
    /// Whether to create the demo policy when no policy exists (`SPILLWAY_SEED_DEMO`).
    pub seed_demo: bool,
    /// Whether checks are also counted per rule (`SPILLWAY_METRICS_RULE_LABEL`, default
    /// off): a `rule` label multiplies the series by the rules of every policy.
    pub metrics_rule_label: bool,
    /// A port of its own for `/metrics` (`SPILLWAY_METRICS_ADDR`, at `SPILLWAY_METRICS_PATH`,
    /// default `/metrics`; upstream's `USE_PROMETHEUS` and `PROMETHEUS_ADDR` set it); the
    /// HTTP port serves `/metrics` either way.
    pub metrics_port: Option<(std::net::SocketAddr, String)>,
    /// Envoy hits also under upstream's series, as its default statsd mapper names them
    /// (`SPILLWAY_METRICS_UPSTREAM_NAMES`): what Envoy Gateway's dashboards read.
    pub metrics_upstream_names: bool,
    /// Checks kept per policy for what-if replays (`SPILLWAY_RECORD_CHECKS`, default
    /// [`DEFAULT_RECORD_CHECKS`]; 0 records none).
    pub record_checks: u64,
    /// Session timeouts (`SPILLWAY_SESSION_IDLE_MS`, default 30 min;
    /// `SPILLWAY_SESSION_ABSOLUTE_MS`, default 12 h) and `SPILLWAY_SECURE_COOKIES=1` to mark
    /// cookies Secure even without `X-Forwarded-Proto: https`.
    pub sessions: SessionSettings,
    /// Envoy's rate limit protocol: where gRPC is served, whether callers need a key, which
    /// headers the answers carry.
    pub envoy: EnvoySettings,
    /// How often each instance adds its counts to the history
    /// (`SPILLWAY_HISTORY_FLUSH_MS`, default 5000).
    pub history_flush: Duration,
    /// How often the alert rules are evaluated (`SPILLWAY_ALERT_EVAL_MS`, default 10000),
    /// by one instance at a time.
    pub alert_eval: Duration,
    /// The dashboard's address as alert receivers reach it (`SPILLWAY_PUBLIC_URL`, default
    /// `http://<LEPTOS_SITE_ADDR>`), for the links in webhook payloads.
    pub public_url: String,
    /// Internal hosts and networks alert webhooks may reach
    /// (`SPILLWAY_WEBHOOK_ALLOWED_TARGETS`; default none: public addresses only).
    pub webhook_targets: crate::net::outbound::Targets,
    /// OpenTelemetry traces, from the standard `OTEL_*` variables (`crate::telemetry::traces`); `None`
    /// (the default) sends none.
    pub traces: Option<crate::telemetry::traces::TraceSettings>,
    /// TLS on the HTTP and gRPC ports (`SPILLWAY_TLS_*`, `SPILLWAY_HTTP_TLS_*`,
    /// `SPILLWAY_GRPC_TLS_*`; see `crate::net::tls`), its files loaded; none by default.
    pub tls: crate::net::tls::Ports,
    /// The log filter when `RUST_LOG` is unset (`SPILLWAY_LOG_LEVEL`, which upstream's
    /// `LOG_LEVEL` sets; default `info`).
    pub log_level: Option<String>,
    /// A folder of Envoy domain files kept loaded (`SPILLWAY_DOMAINS_DIR`, which upstream's
    /// runtime variables set), read by the domains folder front door.
    pub domains_dir: Option<std::path::PathBuf>,
    /// Domains over xDS from a management server (`SPILLWAY_XDS_*`), for the xDS client.
    pub xds: Option<xds::XdsSettings>,
    /// Whether the environment is envoyproxy/ratelimit's ([`upstream`]), and what of it was
    /// let go (logged once at start).
    pub upstream: Option<Vec<String>>,
}

/// How long sessions live.
#[derive(Clone, Copy, Debug)]
pub struct SessionSettings {
    /// Ends a session nobody used for this long (30 min).
    pub idle: Duration,
    /// Ends every session this long after sign-in (12 h).
    pub absolute: Duration,
    /// Always mark the cookie Secure (otherwise only when the request came over https,
    /// as `X-Forwarded-Proto` says); on when the HTTP port serves TLS.
    pub secure_cookies: bool,
}

impl Default for SessionSettings {
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(30 * 60),
            absolute: Duration::from_secs(12 * 3600),
            secure_cookies: false,
        }
    }
}

/// Envoy's rate limit protocol (`SPILLWAY_GRPC_ADDR`, `SPILLWAY_GRPC_AUTH`,
/// `SPILLWAY_ENVOY_HEADERS`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvoySettings {
    /// Where the gRPC server listens (default `127.0.0.1:8081`); `None` (set empty): off.
    pub grpc_addr: Option<std::net::SocketAddr>,
    /// Whether callers must send a service key (`SPILLWAY_GRPC_AUTH=none` turns it off, for
    /// meshes that protect the port another way).
    pub require_key: bool,
    /// Which rate limit headers the answers ask Envoy to add.
    pub headers: EnvoyHeaders,
    /// How a domain that does not say counts a request over its limit: every hit counts
    /// (envoyproxy/ratelimit's default), or all or nothing when
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` is true (upstream's variable).
    pub counting: crate::domain::envoy::Counting,
    /// Every request answered OK whatever its limits say, each descriptor's status still
    /// its own (`SPILLWAY_ENVOY_SHADOW_MODE`; upstream's `SHADOW_MODE` sets it): a whole
    /// deployment watched before it enforces.
    pub shadow_all: bool,
    /// A domain in several files (a folder, xDS resources) is one domain, their top-level
    /// descriptors added together (`SPILLWAY_ENVOY_MERGE_DOMAINS`; upstream's
    /// `MERGE_DOMAIN_CONFIG` sets it); otherwise such files are refused.
    pub merge_domains: bool,
    /// Every Envoy limit in quota mode (`SPILLWAY_ENVOY_QUOTA_MODE`; upstream's `QUOTA_MODE`
    /// sets it), as a descriptor's `quota_mode: true` puts its own.
    pub quota_all: bool,
}

/// The rate limit headers of an Envoy answer (`SPILLWAY_ENVOY_HEADERS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvoyHeaders {
    /// `none`.
    None,
    /// `ietf` (default): the IETF draft's `RateLimit-Policy` and `RateLimit`.
    Ietf,
    /// `draft03`: envoyproxy/ratelimit's `RateLimit-Limit`, `-Remaining`, `-Reset` (the
    /// draft's third version), plain numbers.
    Draft03,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Pretty,
    Json,
}

/// A setting that could not be used; names the variable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{name}: {problem}")]
    Invalid { name: &'static str, problem: String },
    #[error("reading Leptos settings: {0}")]
    Leptos(String),
}

impl Config {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        // Started as envoyproxy/ratelimit (`/bin/ratelimit`, the image's link): its
        // environment, unless SPILLWAY_UPSTREAM_ENV says otherwise.
        let as_upstream = std::env::args_os()
            .next()
            .is_some_and(|arg| Path::new(&arg).file_name() == Some("ratelimit".as_ref()));
        Self::from_lookup(|name| {
            std::env::var(name).ok().or_else(|| {
                (as_upstream && name == "SPILLWAY_UPSTREAM_ENV").then(|| "true".to_owned())
            })
        })
    }

    /// Whether Envoy domain files are merged (`SPILLWAY_ENVOY_MERGE_DOMAINS`, which upstream's
    /// `MERGE_DOMAIN_CONFIG` sets in its environment), read as the server reads it: for
    /// commands that start no server (`spillway policy validate`).
    pub fn merge_domains(lookup: impl Fn(&str) -> Option<String>) -> Result<bool, ConfigError> {
        let invalid = |(name, problem)| ConfigError::Invalid { name, problem };
        let upstream = upstream::Upstream::read(&lookup).map_err(invalid)?;
        let lookup = |name: &str| {
            upstream
                .as_ref()
                .and_then(|u| u.get(name))
                .or_else(|| lookup(name))
        };
        yes_or_no(&lookup, "SPILLWAY_ENVOY_MERGE_DOMAINS")
    }

    /// Reads the configuration through `lookup`, so tests can configure without touching
    /// the process environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let invalid = |(name, problem)| ConfigError::Invalid { name, problem };
        // In upstream's environment its variables decide what they name.
        let upstream = upstream::Upstream::read(&lookup).map_err(invalid)?;
        let own = lookup;
        let lookup = |name: &str| {
            upstream
                .as_ref()
                .and_then(|u| u.get(name))
                .or_else(|| own(name))
        };
        let leptos_options = leptos_options(&lookup, upstream.as_ref())?;
        let (redis_url, redis_cluster_urls) = redis_urls(&lookup)?;
        let (service_keys, admin_keys) = api_keys(&lookup)?;
        let tls = crate::net::tls::Ports::from_lookup(&lookup).map_err(invalid)?;
        let mut sessions = session_settings(&lookup)?;
        // Every request to a TLS port came over https.
        sessions.secure_cookies |= tls.http.is_some();
        let capacity = capacity::Capacity::derive(
            &lookup,
            capacity::cgroup_memory_limit(),
            rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft),
        )?;
        Ok(Self {
            envoy: envoy_settings(&lookup)?,
            sessions,
            service_keys,
            admin_keys,
            forward_auth_identifiers: forward_auth_identifiers(&lookup)?,
            forward_auth_deny_status: forward_auth_deny_status(&lookup)?,
            seed_demo: seed_demo(&lookup),
            metrics_rule_label: yes_or_no(&lookup, "SPILLWAY_METRICS_RULE_LABEL")?,
            metrics_port: metrics_port(&lookup)?,
            metrics_upstream_names: yes_or_no(&lookup, "SPILLWAY_METRICS_UPSTREAM_NAMES")?,
            record_checks: record_checks(&lookup)?,
            traces: crate::telemetry::traces::TraceSettings::from_lookup(&lookup)
                .map_err(invalid)?,
            tls,
            log_level: lookup("SPILLWAY_LOG_LEVEL").filter(|l| !l.trim().is_empty()),
            domains_dir: path(&lookup, "SPILLWAY_DOMAINS_DIR"),
            upstream: upstream.as_ref().map(|u| u.ignored.clone()),
            xds: xds_settings(&lookup)?,
            shutdown_drain: shutdown_drain(&lookup)?,
            public_url: lookup("SPILLWAY_PUBLIC_URL")
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| format!("http://{}", leptos_options.site_addr))
                .trim_end_matches('/')
                .to_owned(),
            leptos_options,
            redis_sentinel: sentinel_settings(&lookup, &redis_cluster_urls)?,
            redis_client_cert: redis_client_cert(&lookup, &redis_url, &redis_cluster_urls)?,
            redis_url,
            redis_cluster_urls,
            redis_ca_cert: path(&lookup, "REDIS_CA_CERT"),
            redis_key_prefix: key_prefix(&lookup)?,
            redis_timeout: millis(&lookup, "SPILLWAY_REDIS_TIMEOUT_MS", 50)?,
            request_timeout: millis(&lookup, "SPILLWAY_REQUEST_TIMEOUT_MS", 10_000)?,
            header_read_timeout: millis(&lookup, "SPILLWAY_HEADER_READ_TIMEOUT_MS", 10_000)?,
            max_connections: capacity.max_connections,
            max_pending: capacity.max_pending,
            max_waiting: capacity.max_waiting,
            capacity,
            first_admin: first_admin(&lookup)?,
            history_flush: millis(&lookup, "SPILLWAY_HISTORY_FLUSH_MS", 5000)?,
            alert_eval: millis(&lookup, "SPILLWAY_ALERT_EVAL_MS", 10_000)?,
            webhook_targets: parsed(
                &lookup,
                "SPILLWAY_WEBHOOK_ALLOWED_TARGETS",
                crate::net::outbound::Targets::parse,
            )?,
            trusted_proxies: parsed(
                &lookup,
                "SPILLWAY_TRUSTED_PROXIES",
                crate::net::forwarded::TrustedProxies::parse,
            )?,
            log_format: match lookup("SPILLWAY_LOG_FORMAT").as_deref() {
                Some("json") => LogFormat::Json,
                _ => LogFormat::Pretty,
            },
        })
    }
}

/// A path setting; unset or blank is none.
fn path(lookup: &impl Fn(&str) -> Option<String>, name: &str) -> Option<std::path::PathBuf> {
    lookup(name)
        .filter(|p| !p.trim().is_empty())
        .map(std::path::PathBuf::from)
}

/// Whether `url` names a Redis: `redis://` or `rediss://` (TLS).
fn is_redis_url(url: &str) -> bool {
    url.starts_with("redis://") || url.starts_with("rediss://")
}

/// Whether the list of hashed file names (`hash.txt`) is beside the running binary.
fn hash_file_found(options: &LeptosOptions) -> bool {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(options.hash_file.as_ref())))
        .is_some_and(|file| file.is_file())
}

/// Checks kept per policy for what-if replays unless said.
pub const DEFAULT_RECORD_CHECKS: u64 = 100_000;
/// The most `SPILLWAY_RECORD_CHECKS` may say.
pub const MAX_RECORD_CHECKS: u64 = 10_000_000;

fn record_checks(lookup: &impl Fn(&str) -> Option<String>) -> Result<u64, ConfigError> {
    let name = "SPILLWAY_RECORD_CHECKS";
    match lookup(name).filter(|v| !v.trim().is_empty()) {
        None => Ok(DEFAULT_RECORD_CHECKS),
        Some(raw) => raw
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&n| n <= MAX_RECORD_CHECKS)
            .ok_or_else(|| ConfigError::Invalid {
                name,
                problem: format!(
                    "expected a whole number from 0 (record none) to {MAX_RECORD_CHECKS}, got {raw:?}"
                ),
            }),
    }
}

/// Whether to seed the demo policy: on unless switched off, so a first run shows something.
fn seed_demo(lookup: &impl Fn(&str) -> Option<String>) -> bool {
    !matches!(
        lookup("SPILLWAY_SEED_DEMO").as_deref(),
        Some("0" | "false" | "no")
    )
}
