//! envoyproxy/ratelimit's environment, as Envoy Gateway and Istio's guide set it, read as
//! Spillway's own settings: replacing upstream's image is the whole migration.
//!
//! The environment is upstream's when the binary is started as upstream's
//! (`/bin/ratelimit`, the image's link to it), when it holds one of upstream's own
//! variables ([`MARKERS`]), or when `SPILLWAY_UPSTREAM_ENV=true` says so (`false` turns the
//! reading off). Then upstream's variables decide what they name, with upstream's defaults: HTTP
//! (`/json`, `/healthcheck`, and the dashboard) on `HOST:PORT` (0.0.0.0:8080), gRPC on
//! `GRPC_HOST:GRPC_PORT` (0.0.0.0:8081), Redis at `REDIS_URL` (host:port), callers without a
//! key, no rate limit headers unless `LIMIT_RESPONSE_HEADERS_ENABLED`, domains from the
//! runtime folder. A variable with no equivalent that would not change a decision is logged
//! once at start ([`Upstream::ignored`]); one that would is refused, naming it.

use std::collections::HashMap;

/// A setting that cannot be used: the variable and what is wrong.
pub type Problem = (&'static str, String);

/// Variables only upstream's environment holds (not `PORT` or `GRPC_PORT`: Kubernetes's
/// service links and other platforms set names like those).
pub const MARKERS: [&str; 6] = [
    "CONFIG_TYPE",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "USE_STATSD",
    "REDIS_SOCKET_TYPE",
    "GRPC_SERVER_USE_TLS",
];

/// Upstream variables read and let go: no equivalent here, and no decision depends on them.
const LET_GO: [(&str, &str); 16] = [
    (
        "USE_STATSD",
        "no statsd: Prometheus metrics are on /metrics of the HTTP port",
    ),
    (
        "USE_DOG_STATSD",
        "no statsd: Prometheus metrics are on /metrics of the HTTP port",
    ),
    (
        "PROMETHEUS_MAPPER_YAML",
        "the metrics port names upstream's series as its default mapper does (ratelimit_service_rate_limit_*{domain,key1,key2}), beside Spillway's own",
    ),
    (
        "DEBUG_PORT",
        "no debug port: /metrics and the dashboard are on the HTTP port",
    ),
    ("REDIS_POOL_SIZE", "one multiplexed connection per instance"),
    (
        "REDIS_PIPELINE_WINDOW",
        "checks are batched by the coalescer",
    ),
    (
        "REDIS_PIPELINE_LIMIT",
        "checks are batched by the coalescer",
    ),
    (
        "REDIS_TIMEOUT",
        "the Redis timeout is SPILLWAY_REDIS_TIMEOUT_MS",
    ),
    (
        "NEAR_LIMIT_RATIO",
        "near-limit is shown on the dashboard at 80%",
    ),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        "keys expire with their window",
    ),
    (
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "over-limit answers come from Redis",
    ),
    ("GRPC_MAX_CONNECTION_AGE", "connections are kept while used"),
    (
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        "connections are kept while used",
    ),
    (
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        "/healthcheck follows Redis and shutdown",
    ),
    ("RUNTIME_IGNOREDOTFILES", "dot files are always skipped"),
    (
        "GRPC_SERVER_TLS_CA_CERT",
        "envoyproxy/ratelimit does not read it either; GRPC_CLIENT_TLS_CACERT requires client certificates",
    ),
];

/// Upstream variables that would change a decision and have no equivalent here, with the
/// value they may hold and still be taken (upstream's default).
const REFUSED: [(&str, &[&str], &str); 5] = [
    ("BACKEND_TYPE", &["redis"], "only Redis is a backend"),
    (
        "REDIS_PERSECOND",
        &["false"],
        "per-second limits share the one Redis",
    ),
    ("GRPC_UDS", &[""], "gRPC is served on a TCP port"),
    (
        "GRPC_CLIENT_TLS_SAN",
        &[""],
        "client certificates are checked against the CA only",
    ),
    (
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        &["false"],
        "Redis's certificate is always verified",
    ),
];

/// Spillway's settings as upstream's environment says them.
/// Not `Debug`: its Redis URL may hold a password.
#[derive(Default)]
pub struct Upstream {
    values: HashMap<&'static str, String>,
    /// What was read and let go, a line each, for the log at start.
    pub ignored: Vec<String>,
}

impl Upstream {
    /// Reads upstream's environment through `lookup`: `None` when it is not upstream's.
    pub fn read(lookup: &impl Fn(&str) -> Option<String>) -> Result<Option<Self>, Problem> {
        let get = |name: &str| lookup(name).map(|v| v.trim().to_owned());
        match get("SPILLWAY_UPSTREAM_ENV").as_deref() {
            Some("false" | "0") => return Ok(None),
            Some("true" | "1") => {}
            None | Some("") if MARKERS.iter().any(|m| get(m).is_some()) => {}
            None | Some("") => return Ok(None),
            Some(other) => {
                return Err((
                    "SPILLWAY_UPSTREAM_ENV",
                    format!("expected true or false, got {other:?}"),
                ));
            }
        }
        let mut upstream = Self::default();
        for (name, accepted, why) in REFUSED {
            if let Some(value) = get(name)
                && !accepted.iter().any(|a| a.eq_ignore_ascii_case(&value))
            {
                return Err((
                    name,
                    format!("{value:?} would change what is limited, and {why}"),
                ));
            }
        }
        for (name, why) in LET_GO {
            if let Some(value) = get(name) {
                upstream
                    .ignored
                    .push(format!("{name}={value} is not used: {why}"));
            }
        }
        upstream.listeners(&get)?;
        upstream.redis(&get)?;
        upstream.grpc_tls(&get)?;
        upstream.answers(&get)?;
        upstream.logs(&get)?;
        upstream.telemetry(&get)?;
        upstream.domains(&get)?;
        Ok(Some(upstream))
    }

    /// Spillway's variable `name` as upstream's environment sets it.
    pub fn get(&self, name: &str) -> Option<String> {
        self.values.get(name).cloned()
    }

    fn set(&mut self, name: &'static str, value: impl Into<String>) {
        self.values.insert(name, value.into());
    }

    /// HTTP on HOST:PORT, gRPC on GRPC_HOST:GRPC_PORT.
    fn listeners(&mut self, get: &impl Fn(&str) -> Option<String>) -> Result<(), Problem> {
        let addr = |host: &'static str, port: &'static str, default: u16| {
            let host = get(host).filter(|h| !h.is_empty());
            let host = host.as_deref().unwrap_or("0.0.0.0");
            let port = match get(port).filter(|p| !p.is_empty()) {
                None => default,
                Some(p) => p
                    .parse::<u16>()
                    .map_err(|_| (port, format!("expected a port number, got {p:?}")))?,
            };
            // `localhost` listens on the loopback; another host name (not an address) on
            // every interface.
            let ip: std::net::IpAddr = match host.trim_matches(['[', ']']) {
                "localhost" => [127, 0, 0, 1].into(),
                other => other.parse().unwrap_or([0, 0, 0, 0].into()),
            };
            Ok::<_, Problem>(std::net::SocketAddr::new(ip, port).to_string())
        };
        let http = addr("HOST", "PORT", 8080)?;
        let grpc = addr("GRPC_HOST", "GRPC_PORT", 8081)?;
        self.set("LEPTOS_SITE_ADDR", http);
        self.set("SPILLWAY_GRPC_ADDR", grpc);
        Ok(())
    }

    /// REDIS_URL as host:port (several, comma-separated, for a cluster), with REDIS_AUTH,
    /// REDIS_TLS and REDIS_TLS_CACERT.
    fn redis(&mut self, get: &impl Fn(&str) -> Option<String>) -> Result<(), Problem> {
        refuse_unsupported_redis(get)?;
        let Some(url) = get("REDIS_URL").filter(|u| !u.is_empty()) else {
            return Ok(());
        };
        if url.contains("://") {
            // Already a URL: Spillway's own form.
            return Ok(());
        }
        let scheme = if flag(get, "REDIS_TLS")? {
            "rediss"
        } else {
            "redis"
        };
        let auth = redis_auth(get);
        let urls: Vec<String> = url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(|host| format!("{scheme}://{auth}{host}"))
            .collect();
        if urls.is_empty() {
            return Err(("REDIS_URL", "expected host:port".into()));
        }
        let redis_type = get("REDIS_TYPE").map(|t| t.to_ascii_lowercase());
        match redis_type.as_deref() {
            None | Some("" | "single") => {
                if urls.len() > 1 {
                    return Err((
                        "REDIS_URL",
                        "several addresses need REDIS_TYPE=cluster".into(),
                    ));
                }
                self.set("REDIS_URL", urls.concat());
            }
            Some("cluster") => {
                // REDIS_URL must still read as a URL; the cluster's seeds are what is used.
                self.set("REDIS_URL", urls[0].clone());
                self.set("REDIS_CLUSTER_URLS", urls.join(","));
            }
            Some("sentinel") => self.sentinel(get, &url, scheme, &auth)?,
            Some(other) => {
                return Err((
                    "REDIS_TYPE",
                    format!(
                        "{other:?}: a single Redis, a Redis Cluster or Sentinel (single, cluster, sentinel)"
                    ),
                ));
            }
        }
        for (theirs, ours) in [
            ("REDIS_TLS_CACERT", "REDIS_CA_CERT"),
            ("REDIS_TLS_CLIENT_CERT", "REDIS_CLIENT_CERT"),
            ("REDIS_TLS_CLIENT_KEY", "REDIS_CLIENT_KEY"),
        ] {
            if let Some(path) = get(theirs).filter(|c| !c.is_empty()) {
                self.set(ours, path);
            }
        }
        Ok(())
    }

    /// REDIS_TYPE=sentinel: upstream's REDIS_URL names the master first, then the sentinels.
    fn sentinel(
        &mut self,
        get: &impl Fn(&str) -> Option<String>,
        url: &str,
        scheme: &str,
        auth: &str,
    ) -> Result<(), Problem> {
        let mut parts = url.split(',').map(str::trim).filter(|p| !p.is_empty());
        let master = parts.next().unwrap_or_default();
        let sentinels: Vec<&str> = parts.collect();
        if sentinels.is_empty() {
            return Err((
                "REDIS_URL",
                "with REDIS_TYPE=sentinel: the master's name, then the sentinels (mymaster,host:port,…)".into(),
            ));
        }
        self.set(
            "REDIS_URL",
            format!("{scheme}+sentinel://{auth}{}/{master}", sentinels.join(",")),
        );
        if let Some(auth) = get("REDIS_SENTINEL_AUTH").filter(|a| !a.is_empty()) {
            self.set("REDIS_SENTINEL_PASSWORD", auth);
        }
        Ok(())
    }

    /// GRPC_SERVER_USE_TLS with its certificate, key and client CA.
    fn grpc_tls(&mut self, get: &impl Fn(&str) -> Option<String>) -> Result<(), Problem> {
        let on = flag(get, "GRPC_SERVER_USE_TLS")?;
        if !on {
            return Ok(());
        }
        for (theirs, ours) in [
            ("GRPC_SERVER_TLS_CERT", "SPILLWAY_GRPC_TLS_CERT_FILE"),
            ("GRPC_SERVER_TLS_KEY", "SPILLWAY_GRPC_TLS_KEY_FILE"),
        ] {
            match get(theirs).filter(|v| !v.is_empty()) {
                Some(path) => self.set(ours, path),
                None => {
                    return Err((
                        theirs,
                        "GRPC_SERVER_USE_TLS is true, so it is needed".into(),
                    ));
                }
            }
        }
        if let Some(ca) = get("GRPC_CLIENT_TLS_CACERT").filter(|v| !v.is_empty()) {
            self.set("SPILLWAY_GRPC_TLS_CLIENT_CA_FILE", ca);
        }
        Ok(())
    }

    /// Callers send no key (upstream has none); headers only when upstream would add them.
    fn answers(&mut self, get: &impl Fn(&str) -> Option<String>) -> Result<(), Problem> {
        if get("SPILLWAY_GRPC_AUTH").is_none() {
            self.set("SPILLWAY_GRPC_AUTH", "none");
        }
        let headers = if flag(get, "LIMIT_RESPONSE_HEADERS_ENABLED")? {
            "draft03"
        } else {
            "none"
        };
        if get("SPILLWAY_ENVOY_HEADERS").is_none() {
            self.set("SPILLWAY_ENVOY_HEADERS", headers);
        }
        if flag(get, "SHADOW_MODE")? {
            self.set("SPILLWAY_ENVOY_SHADOW_MODE", "true");
        }
        if flag(get, "QUOTA_MODE")? {
            self.set("SPILLWAY_ENVOY_QUOTA_MODE", "true");
        }
        if flag(get, "MERGE_DOMAIN_CONFIG")? {
            self.set("SPILLWAY_ENVOY_MERGE_DOMAINS", "true");
        }
        if let Some(prefix) = get("CACHE_KEY_PREFIX").filter(|p| !p.is_empty()) {
            self.set("SPILLWAY_KEY_PREFIX", prefix);
        }
        for (name, default) in [
            ("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
            ("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
            ("LIMIT_RESET_HEADER", "RateLimit-Reset"),
        ] {
            if let Some(v) = get(name).filter(|v| !v.eq_ignore_ascii_case(default)) {
                self.ignored
                    .push(format!("{name}={v} is not used: the header is {default}"));
            }
        }
        Ok(())
    }

    /// LOG_LEVEL and LOG_FORMAT.
    fn logs(&mut self, get: &impl Fn(&str) -> Option<String>) -> Result<(), Problem> {
        if let Some(level) = get("LOG_LEVEL").filter(|l| !l.is_empty()) {
            let filter = match level.to_ascii_lowercase().as_str() {
                "trace" => "trace",
                "debug" => "debug",
                "info" => "info",
                "warn" | "warning" => "warn",
                "error" | "fatal" | "panic" => "error",
                _ => {
                    return Err((
                        "LOG_LEVEL",
                        format!("expected trace, debug, info, warn or error, got {level:?}"),
                    ));
                }
            };
            self.set("SPILLWAY_LOG_LEVEL", filter);
        }
        if get("LOG_FORMAT").is_some_and(|f| f.eq_ignore_ascii_case("json")) {
            self.set("SPILLWAY_LOG_FORMAT", "json");
        }
        Ok(())
    }

    /// CONFIG_TYPE: FILE reads the runtime folder (RUNTIME_ROOT, RUNTIME_SUBDIRECTORY,
    /// RUNTIME_APPDIRECTORY), GRPC_XDS_SOTW subscribes to a management server.
    fn domains(&mut self, get: &impl Fn(&str) -> Option<String>) -> Result<(), Problem> {
        match get("CONFIG_TYPE")
            .as_deref()
            .map(str::to_ascii_uppercase)
            .as_deref()
        {
            None | Some("" | "FILE") => {}
            Some("GRPC_XDS_SOTW") => return self.xds(get),
            Some(other) => {
                return Err((
                    "CONFIG_TYPE",
                    format!("expected FILE or GRPC_XDS_SOTW, got {other:?}"),
                ));
            }
        }
        let root = get("RUNTIME_ROOT")
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "/srv/runtime_data/current".into());
        let mut dir = std::path::PathBuf::from(root);
        if let Some(sub) = get("RUNTIME_SUBDIRECTORY").filter(|s| !s.is_empty()) {
            dir.push(sub);
        }
        dir.push(
            get("RUNTIME_APPDIRECTORY")
                .filter(|a| !a.is_empty())
                .unwrap_or_else(|| "config".into()),
        );
        self.set("SPILLWAY_DOMAINS_DIR", dir.to_string_lossy());
        Ok(())
    }
}

impl Upstream {
    /// CONFIG_TYPE=GRPC_XDS_SOTW: the management server and how to reach it.
    fn xds(&mut self, get: &impl Fn(&str) -> Option<String>) -> Result<(), Problem> {
        let tls = flag(get, "CONFIG_GRPC_XDS_SERVER_USE_TLS")?;
        let server = get("CONFIG_GRPC_XDS_SERVER_URL")
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "localhost:18000".into());
        let scheme = if tls { "https" } else { "http" };
        self.set("SPILLWAY_XDS_SERVER", format!("{scheme}://{server}"));
        self.set(
            "SPILLWAY_XDS_NODE_ID",
            get("CONFIG_GRPC_XDS_NODE_ID")
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "default".into()),
        );
        for (theirs, ours) in [
            (
                "CONFIG_GRPC_XDS_NODE_METADATA",
                "SPILLWAY_XDS_NODE_METADATA",
            ),
            (
                "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
                "SPILLWAY_XDS_TLS_CERT_FILE",
            ),
            (
                "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
                "SPILLWAY_XDS_TLS_KEY_FILE",
            ),
            (
                "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
                "SPILLWAY_XDS_TLS_CA_FILE",
            ),
            (
                "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
                "SPILLWAY_XDS_TLS_SERVER_NAME",
            ),
        ] {
            if let Some(value) = get(theirs).filter(|v| !v.is_empty()) {
                if !tls && ours.contains("_TLS_") {
                    // Upstream reads no TLS file without CONFIG_GRPC_XDS_SERVER_USE_TLS.
                    continue;
                }
                self.set(ours, value);
            }
        }
        if let Some(headers) =
            get("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS").filter(|h| !h.is_empty())
        {
            // Names only: the values are usually credentials.
            let names: Vec<&str> = headers
                .split(',')
                .filter_map(|h| h.split([':', '=']).next())
                .map(str::trim)
                .collect();
            self.ignored.push(format!(
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS ({}) is not used: no extra metadata is sent",
                names.join(", ")
            ));
        }
        Ok(())
    }
}

/// Upstream's boolean `name`: true or false (Go's strconv.ParseBool spellings), unset false.
fn flag(get: &impl Fn(&str) -> Option<String>, name: &'static str) -> Result<bool, Problem> {
    match get(name).as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("" | "false" | "0" | "f") => Ok(false),
        Some("true" | "1" | "t") => Ok(true),
        Some(other) => Err((name, format!("expected true or false, got {other:?}"))),
    }
}

/// What upstream can ask of Redis that Spillway cannot give: a Unix socket.
fn refuse_unsupported_redis(get: &impl Fn(&str) -> Option<String>) -> Result<(), Problem> {
    let socket = get("REDIS_SOCKET_TYPE").map(|t| t.to_ascii_lowercase());
    if let Some(other) = socket.as_deref().filter(|t| !matches!(*t, "" | "tcp")) {
        return Err((
            "REDIS_SOCKET_TYPE",
            format!("{other:?}: Redis is reached over TCP here (set tcp and REDIS_URL host:port)"),
        ));
    }
    Ok(())
}

/// REDIS_AUTH as a URL's user part: "user:password" or a password alone, as upstream reads
/// it, each percent-encoded (empty when unset).
fn redis_auth(get: &impl Fn(&str) -> Option<String>) -> String {
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    match get("REDIS_AUTH").filter(|a| !a.is_empty()) {
        None => String::new(),
        Some(auth) => match auth.split_once(':') {
            Some((user, password)) => format!("{}:{}@", enc(user), enc(password)),
            None => format!(":{}@", enc(&auth)),
        },
    }
}

mod telemetry;

#[cfg(test)]
mod tests;
