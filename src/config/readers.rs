//! One reader a group of settings: each checks its values and names the setting in its
//! error, so `Config::from_lookup` reads as a list.

use std::{path::Path, time::Duration};

use super::*;

/// Leptos's settings: `Leptos.toml` (or `SPILLWAY_LEPTOS_TOML`), Leptos's own `LEPTOS_*`
/// variables, and in upstream's environment its `HOST` and `PORT`.
pub(super) fn leptos_options(
    lookup: &impl Fn(&str) -> Option<String>,
    upstream: Option<&upstream::Upstream>,
) -> Result<LeptosOptions, ConfigError> {
    let leptos_toml = lookup("SPILLWAY_LEPTOS_TOML").unwrap_or_else(|| "Leptos.toml".into());
    let file = Path::new(&leptos_toml)
        .exists()
        .then_some(leptos_toml.as_str());
    let mut conf =
        leptos::config::get_configuration(file).map_err(|e| ConfigError::Leptos(e.to_string()))?;
    if conf.leptos_options.hash_files && !hash_file_found(&conf.leptos_options) {
        // A binary not built by cargo-leptos (`cargo run`, the tests) has no list of
        // hashed names beside it: its pages name the files without hashes (and Leptos
        // would stop at the missing list while rendering).
        conf.leptos_options.hash_files = false;
    }
    // Leptos reads LEPTOS_SITE_ADDR from the process; upstream's HOST and PORT say it
    // here.
    if let Some(addr) = upstream.and_then(|u| u.get("LEPTOS_SITE_ADDR")) {
        conf.leptos_options.site_addr = addr.parse().map_err(|_| ConfigError::Invalid {
            name: "PORT",
            problem: format!("{addr} is not an address to listen on"),
        })?;
    }
    Ok(conf.leptos_options)
}

/// `true`/`yes`/`1` or `false`/`no`/`0` (unset or empty: false); anything else is an error
/// naming the setting.
pub(super) fn yes_or_no(
    lookup: &impl Fn(&str) -> Option<String>,
    name: &'static str,
) -> Result<bool, ConfigError> {
    match lookup(name).as_deref() {
        None | Some("" | "0" | "false" | "no") => Ok(false),
        Some("1" | "true" | "yes") => Ok(true),
        Some(other) => Err(ConfigError::Invalid {
            name,
            problem: format!("must be true or false, got {other:?}"),
        }),
    }
}

/// A setting read by `parse` (unset: parsed from the empty text), its error naming it.
pub(super) fn parsed<T>(
    lookup: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<T, ConfigError> {
    parse(&lookup(name).unwrap_or_default())
        .map_err(|problem| ConfigError::Invalid { name, problem })
}

/// The xDS subscription (`SPILLWAY_XDS_*`), which excludes a domains folder.
pub(super) fn xds_settings(
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<Option<xds::XdsSettings>, ConfigError> {
    let invalid = |(name, problem)| ConfigError::Invalid { name, problem };
    match xds::XdsSettings::from_lookup(lookup).map_err(invalid)? {
        Some(_) if path(lookup, "SPILLWAY_DOMAINS_DIR").is_some() => Err(ConfigError::Invalid {
            name: "SPILLWAY_XDS_SERVER",
            problem: "domains come from xDS or from SPILLWAY_DOMAINS_DIR, not both".into(),
        }),
        xds => Ok(xds),
    }
}

/// Redis behind Sentinel (`REDIS_SENTINELS` or a `redis+sentinel://` URL), which excludes a
/// cluster.
pub(super) fn sentinel_settings(
    lookup: &impl Fn(&str) -> Option<String>,
    cluster_urls: &[String],
) -> Result<Option<sentinel::SentinelSettings>, ConfigError> {
    match sentinel::SentinelSettings::from_lookup(lookup) {
        Ok(Some(_)) if !cluster_urls.is_empty() => Err(ConfigError::Invalid {
            name: "REDIS_CLUSTER_URLS",
            problem: "set with Sentinel: give one or the other".into(),
        }),
        Ok(s) => Ok(s),
        Err((name, problem)) => Err(ConfigError::Invalid { name, problem }),
    }
}

/// The first admin's password (`SPILLWAY_FIRST_ADMIN_PASSWORD`, held to the password rules)
/// and where a generated one is written (`SPILLWAY_FIRST_ADMIN_PASSWORD_FILE`).
pub(super) fn first_admin(
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<FirstAdmin, ConfigError> {
    let password = match lookup("SPILLWAY_FIRST_ADMIN_PASSWORD").filter(|p| !p.is_empty()) {
        Some(password) => {
            crate::domain::people::validate_password(&password).map_err(|problem| {
                ConfigError::Invalid {
                    name: "SPILLWAY_FIRST_ADMIN_PASSWORD",
                    problem,
                }
            })?;
            Some(password)
        }
        None => None,
    };
    Ok(FirstAdmin {
        password,
        password_file: path(lookup, "SPILLWAY_FIRST_ADMIN_PASSWORD_FILE")
            .unwrap_or_else(|| std::env::temp_dir().join("spillway-first-admin-password")),
    })
}

/// The comma-separated values of `name`, trimmed, empty ones left out; none when unset.
pub(super) fn comma_list(lookup: &impl Fn(&str) -> Option<String>, name: &str) -> Vec<String> {
    lookup(name)
        .map(|raw| {
            raw.split(',')
                .map(|k| k.trim().to_owned())
                .filter(|k| !k.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// The Redis to use (`REDIS_URL`, default `redis://127.0.0.1:6379`) and a cluster's seed
/// nodes (`REDIS_CLUSTER_URLS`, none unless set).
pub(super) fn redis_urls(
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<(String, Vec<String>), ConfigError> {
    let redis_url = lookup("REDIS_URL").unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    // A redis+sentinel:// URL is read by `sentinel::SentinelSettings`.
    let sentinel =
        redis_url.starts_with("redis+sentinel://") || redis_url.starts_with("rediss+sentinel://");
    if !is_redis_url(&redis_url) && !sentinel {
        return Err(ConfigError::Invalid {
            name: "REDIS_URL",
            problem: "must start with redis://, rediss://, redis+sentinel:// or rediss+sentinel://"
                .into(),
        });
    }
    let redis_cluster_urls = comma_list(lookup, "REDIS_CLUSTER_URLS");
    if let Some(bad) = redis_cluster_urls.iter().find(|u| !is_redis_url(u)) {
        return Err(ConfigError::Invalid {
            name: "REDIS_CLUSTER_URLS",
            problem: format!("every URL must start with redis:// or rediss://, got {bad:?}"),
        });
    }
    Ok((redis_url, redis_cluster_urls))
}

/// The service keys and the admin keys (`SPILLWAY_SERVICE_KEYS`, `SPILLWAY_ADMIN_KEYS`),
/// each at least 32 characters.
pub(super) fn api_keys(
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<(Vec<String>, Vec<String>), ConfigError> {
    let (service_keys, admin_keys) = (
        comma_list(lookup, "SPILLWAY_SERVICE_KEYS"),
        comma_list(lookup, "SPILLWAY_ADMIN_KEYS"),
    );
    if let Some(short) = service_keys
        .iter()
        .chain(&admin_keys)
        .find(|k| k.len() < 32)
    {
        return Err(ConfigError::Invalid {
            name: "SPILLWAY_SERVICE_KEYS/SPILLWAY_ADMIN_KEYS",
            problem: format!(
                "every key must be at least 32 characters; one has {}",
                short.len()
            ),
        });
    }
    Ok((service_keys, admin_keys))
}

/// Forward-auth's (dimension, lowercase header name) pairs
/// (`SPILLWAY_FORWARD_AUTH_IDENTIFIERS`, default `ip=X-Forwarded-For`).
pub(super) fn forward_auth_identifiers(
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut forward_auth_identifiers = Vec::new();
    let raw_fa =
        lookup("SPILLWAY_FORWARD_AUTH_IDENTIFIERS").unwrap_or_else(|| "ip=X-Forwarded-For".into());
    for pair in raw_fa.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (dimension, header) = pair.split_once('=').ok_or_else(|| ConfigError::Invalid {
            name: "SPILLWAY_FORWARD_AUTH_IDENTIFIERS",
            problem: format!("expected dimension=Header-Name pairs, got {pair:?}"),
        })?;
        crate::domain::Name::parse(dimension.trim()).map_err(|problem| ConfigError::Invalid {
            name: "SPILLWAY_FORWARD_AUTH_IDENTIFIERS",
            problem,
        })?;
        axum::http::HeaderName::try_from(header.trim()).map_err(|_| ConfigError::Invalid {
            name: "SPILLWAY_FORWARD_AUTH_IDENTIFIERS",
            problem: format!("{header:?} is not a header name"),
        })?;
        forward_auth_identifiers.push((
            dimension.trim().to_owned(),
            header.trim().to_ascii_lowercase(),
        ));
    }
    Ok(forward_auth_identifiers)
}

/// The status of a forward-auth denial (`SPILLWAY_FORWARD_AUTH_DENY_STATUS`, 400 to 599,
/// default 429).
pub(super) fn forward_auth_deny_status(
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<u16, ConfigError> {
    match lookup("SPILLWAY_FORWARD_AUTH_DENY_STATUS") {
        None => Ok(429),
        Some(raw) => match raw.trim().parse::<u16>() {
            Ok(s) if (400..=599).contains(&s) => Ok(s),
            _ => Err(ConfigError::Invalid {
                name: "SPILLWAY_FORWARD_AUTH_DENY_STATUS",
                problem: format!("expected an HTTP status from 400 to 599, got {raw:?}"),
            }),
        },
    }
}

/// How long sessions live, and whether their cookies are always Secure.
pub(super) fn session_settings(
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<SessionSettings, ConfigError> {
    Ok(SessionSettings {
        idle: millis(lookup, "SPILLWAY_SESSION_IDLE_MS", 30 * 60 * 1000)?,
        absolute: millis(lookup, "SPILLWAY_SESSION_ABSOLUTE_MS", 12 * 3600 * 1000)?,
        secure_cookies: matches!(
            lookup("SPILLWAY_SECURE_COOKIES").as_deref(),
            Some("1" | "true" | "yes")
        ),
    })
}

/// Envoy's rate limit protocol: the gRPC address, whether callers need a key, and the
/// headers of the answers.
pub(super) fn envoy_settings(
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<EnvoySettings, ConfigError> {
    Ok(EnvoySettings {
        grpc_addr: match lookup("SPILLWAY_GRPC_ADDR") {
            None => Some(([127, 0, 0, 1], 8081).into()),
            Some(raw) if raw.trim().is_empty() => None,
            Some(raw) => Some(raw.trim().parse().map_err(|_| ConfigError::Invalid {
                name: "SPILLWAY_GRPC_ADDR",
                problem: format!(
                    "expected host:port such as 127.0.0.1:8081, or empty for off; got {raw:?}"
                ),
            })?),
        },
        require_key: match lookup("SPILLWAY_GRPC_AUTH").as_deref().map(str::trim) {
            None | Some("key") => true,
            Some("none") => false,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    name: "SPILLWAY_GRPC_AUTH",
                    problem: format!("expected key (the default) or none, got {other:?}"),
                });
            }
        },
        headers: match lookup("SPILLWAY_ENVOY_HEADERS").as_deref().map(str::trim) {
            None | Some("ietf") => EnvoyHeaders::Ietf,
            Some("none") => EnvoyHeaders::None,
            Some("draft03") => EnvoyHeaders::Draft03,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    name: "SPILLWAY_ENVOY_HEADERS",
                    problem: format!("expected ietf (the default), draft03 or none, got {other:?}"),
                });
            }
        },
        counting: stop_when_over(lookup)?,
        shadow_all: yes_or_no(lookup, "SPILLWAY_ENVOY_SHADOW_MODE")?,
        merge_domains: yes_or_no(lookup, "SPILLWAY_ENVOY_MERGE_DOMAINS")?,
        quota_all: yes_or_no(lookup, "SPILLWAY_ENVOY_QUOTA_MODE")?,
    })
}

/// envoyproxy/ratelimit's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: true makes every domain
/// that does not say count all or nothing; false or unset, every hit counts.
pub(super) fn stop_when_over(
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<crate::domain::envoy::Counting, ConfigError> {
    use crate::domain::envoy::Counting;
    match lookup("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")
        .as_deref()
        .map(|v| v.trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("" | "false" | "0") => Ok(Counting::EveryHit),
        Some("true" | "1") => Ok(Counting::AllOrNothing),
        Some(other) => Err(ConfigError::Invalid {
            name: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
            problem: format!("expected true or false, got {other:?}"),
        }),
    }
}

pub(super) fn millis(
    lookup: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: u64,
) -> Result<Duration, ConfigError> {
    match lookup(name) {
        None => Ok(Duration::from_millis(default)),
        Some(raw) => match raw.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
            _ => Err(ConfigError::Invalid {
                name,
                problem: format!("expected a whole number of milliseconds above 0, got {raw:?}"),
            }),
        },
    }
}

/// `REDIS_CLIENT_CERT` and `REDIS_CLIENT_KEY`: both or neither, and only where they are
/// shown: TLS to a single Redis (`rediss://`) or through Sentinel (`rediss+sentinel://`,
/// `REDIS_SENTINEL_TLS=true`); not a Cluster.
pub(super) fn redis_client_cert(
    lookup: &impl Fn(&str) -> Option<String>,
    redis_url: &str,
    cluster: &[String],
) -> Result<Option<(std::path::PathBuf, std::path::PathBuf)>, ConfigError> {
    let get = |name| lookup(name).filter(|v: &String| !v.trim().is_empty());
    let tls = redis_url.starts_with("rediss")
        || lookup("REDIS_SENTINEL_TLS").is_some_and(|v| v.trim() == "true");
    let refused = |problem: &str| {
        Err(ConfigError::Invalid {
            name: "REDIS_CLIENT_CERT",
            problem: problem.into(),
        })
    };
    match (get("REDIS_CLIENT_CERT"), get("REDIS_CLIENT_KEY")) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) if !cluster.is_empty() => refused(
            "client certificates are not supported with a Redis Cluster (REDIS_CLUSTER_URLS)",
        ),
        (Some(_), Some(_)) if !tls => refused(
            "a client certificate is shown over TLS only: use rediss:// (or REDIS_SENTINEL_TLS=true)",
        ),
        (Some(cert), Some(key)) => Ok(Some((cert.into(), key.into()))),
        (Some(_), None) => Err(ConfigError::Invalid {
            name: "REDIS_CLIENT_KEY",
            problem: "REDIS_CLIENT_CERT is set, so its key is needed".into(),
        }),
        (None, Some(_)) => Err(ConfigError::Invalid {
            name: "REDIS_CLIENT_CERT",
            problem: "REDIS_CLIENT_KEY is set, so its certificate is needed".into(),
        }),
    }
}

/// `SPILLWAY_KEY_PREFIX`: printable, without spaces or braces (a brace would move every key
/// into one Redis Cluster slot), at most 64 characters.
pub(super) fn key_prefix(lookup: &impl Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
    let prefix = lookup("SPILLWAY_KEY_PREFIX").unwrap_or_default();
    if prefix.len() > 64
        || prefix
            .chars()
            .any(|c| !c.is_ascii_graphic() || c == '{' || c == '}')
    {
        return Err(ConfigError::Invalid {
            name: "SPILLWAY_KEY_PREFIX",
            problem: format!(
                "expected at most 64 printable characters without spaces or braces (such as eg:rl:), got {prefix:?}"
            ),
        });
    }
    Ok(prefix)
}

/// `SPILLWAY_METRICS_ADDR` (host:port; unset or empty: no port of its own) and
/// `SPILLWAY_METRICS_PATH` (default `/metrics`).
pub(super) fn metrics_port(
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<Option<(std::net::SocketAddr, String)>, ConfigError> {
    let Some(raw) = lookup("SPILLWAY_METRICS_ADDR").filter(|a| !a.trim().is_empty()) else {
        return Ok(None);
    };
    let addr = raw.trim().parse().map_err(|_| ConfigError::Invalid {
        name: "SPILLWAY_METRICS_ADDR",
        problem: format!("expected host:port such as 0.0.0.0:19001, got {raw:?}"),
    })?;
    let path = lookup("SPILLWAY_METRICS_PATH").unwrap_or_else(|| "/metrics".into());
    if !path.starts_with('/') || path.contains(char::is_whitespace) {
        return Err(ConfigError::Invalid {
            name: "SPILLWAY_METRICS_PATH",
            problem: format!("expected a path such as /metrics, got {path:?}"),
        });
    }
    Ok(Some((addr, path)))
}

/// `SPILLWAY_SHUTDOWN_DRAIN_MS` (default 1000; 0 closes at once).
pub(super) fn shutdown_drain(
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<Duration, ConfigError> {
    match lookup("SPILLWAY_SHUTDOWN_DRAIN_MS").as_deref() {
        Some("0") => Ok(Duration::ZERO),
        _ => millis(lookup, "SPILLWAY_SHUTDOWN_DRAIN_MS", 1000),
    }
}
