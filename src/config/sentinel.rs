//! Redis behind Sentinel: where the sentinels are, the master's name, and the credentials
//! (`REDIS_SENTINELS` and friends, or a `redis+sentinel://` URL in `REDIS_URL`).

/// How to find the master through Sentinel. Its `Debug` leaves the passwords out.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelSettings {
    /// The sentinels, `host` and `port`; any one that answers is enough.
    pub sentinels: Vec<(String, u16)>,
    /// The master's name in the sentinels' configuration (`sentinel monitor <name> …`).
    pub master: String,
    /// For the master (and its replicas): `AUTH` user and password.
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: i64,
    /// For the sentinels themselves (`requirepass` in sentinel.conf).
    pub sentinel_password: Option<String>,
    /// TLS to the sentinels and the master (`rediss+sentinel://`, or `REDIS_SENTINEL_TLS`).
    pub tls: bool,
}

impl std::fmt::Debug for SentinelSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |p: &Option<String>| p.as_ref().map(|_| "<set>");
        f.debug_struct("SentinelSettings")
            .field("sentinels", &self.sentinels)
            .field("master", &self.master)
            .field("username", &self.username)
            .field("password", &set(&self.password))
            .field("db", &self.db)
            .field("sentinel_password", &set(&self.sentinel_password))
            .field("tls", &self.tls)
            .finish()
    }
}

type Problem = (&'static str, String);

impl SentinelSettings {
    /// The settings, when Sentinel is configured: `REDIS_URL=redis+sentinel://[user:password@]
    /// host:port[,host:port…]/<master>[/<db>]` (`rediss+sentinel://` for TLS), or
    /// `REDIS_SENTINELS=host:port,…` with `REDIS_SENTINEL_MASTER` (default `mymaster`),
    /// `REDIS_PASSWORD`, `REDIS_USERNAME`. `REDIS_SENTINEL_PASSWORD` and
    /// `REDIS_SENTINEL_TLS=true` apply to either.
    pub fn from_lookup(lookup: &impl Fn(&str) -> Option<String>) -> Result<Option<Self>, Problem> {
        let set = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let sentinel_password = set("REDIS_SENTINEL_PASSWORD");
        let tls_flag = match set("REDIS_SENTINEL_TLS").as_deref().map(str::trim) {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                return Err((
                    "REDIS_SENTINEL_TLS",
                    format!("must be true or false, got {other:?}"),
                ));
            }
        };
        if let Some(url) = set("REDIS_URL")
            && let Some((tls, rest)) = url
                .strip_prefix("redis+sentinel://")
                .map(|r| (false, r))
                .or_else(|| url.strip_prefix("rediss+sentinel://").map(|r| (true, r)))
        {
            if set("REDIS_SENTINELS").is_some() {
                return Err((
                    "REDIS_SENTINELS",
                    "set with a redis+sentinel:// REDIS_URL: give the sentinels once".into(),
                ));
            }
            let mut settings = parse_url(rest).map_err(|m| ("REDIS_URL", m))?;
            settings.sentinel_password = sentinel_password;
            settings.tls = tls || tls_flag;
            return Ok(Some(settings));
        }
        let Some(list) = set("REDIS_SENTINELS") else {
            return Ok(None);
        };
        Ok(Some(Self {
            sentinels: addresses(&list).map_err(|m| ("REDIS_SENTINELS", m))?,
            master: set("REDIS_SENTINEL_MASTER").unwrap_or_else(|| "mymaster".into()),
            username: set("REDIS_USERNAME"),
            password: set("REDIS_PASSWORD"),
            db: 0,
            sentinel_password,
            tls: tls_flag,
        }))
    }
}

/// `host:port,host:port` (a port is required; IPv6 in brackets).
fn addresses(list: &str) -> Result<Vec<(String, u16)>, String> {
    let mut out = Vec::new();
    for raw in list.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let (host, port) = raw
            .rsplit_once(':')
            .ok_or_else(|| format!("{raw:?} is not host:port"))?;
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{raw:?} has no port from 1 to 65535"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(format!("{raw:?} has no host"));
        }
        out.push((host.to_owned(), port));
    }
    if out.is_empty() {
        return Err("names no sentinel (host:port, comma-separated)".into());
    }
    Ok(out)
}

/// What follows `redis+sentinel://`: `[user:password@]hosts/<master>[/<db>]`.
fn parse_url(rest: &str) -> Result<SentinelSettings, String> {
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, rest)) => (Some(auth), rest),
        None => (None, rest),
    };
    let (username, password) = match auth {
        None => (None, None),
        Some(auth) => {
            let (user, password) = auth.split_once(':').unwrap_or(("", auth));
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8()
                    .map(|d| d.into_owned())
                    .map_err(|_| "the credentials are not UTF-8".to_owned())
            };
            (
                Some(decode(user)?).filter(|u| !u.is_empty()),
                Some(decode(password)?).filter(|p| !p.is_empty()),
            )
        }
    };
    let (hosts, path) = rest
        .split_once('/')
        .ok_or("names no master: redis+sentinel://host:port,host:port/<master>")?;
    let mut parts = path.split('/').filter(|p| !p.is_empty());
    let master = parts
        .next()
        .ok_or("names no master: redis+sentinel://host:port,host:port/<master>")?
        .to_owned();
    let db = match parts.next() {
        None => 0,
        Some(db) => db
            .parse::<i64>()
            .ok()
            .filter(|d| *d >= 0)
            .ok_or_else(|| format!("database {db:?} is not a number"))?,
    };
    Ok(SentinelSettings {
        sentinels: addresses(hosts)?,
        master,
        username,
        password,
        db,
        sentinel_password: None,
        tls: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<Option<SentinelSettings>, Problem> {
        SentinelSettings::from_lookup(&|name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn sentinels_come_from_a_url_or_a_list_and_mistakes_name_the_setting() {
        assert_eq!(read(&[("REDIS_URL", "redis://127.0.0.1:6379")]), Ok(None));
        let url = read(&[(
            "REDIS_URL",
            "redis+sentinel://:s%40cret@10.0.0.1:26379,[::1]:26380/cache/2",
        )])
        .unwrap()
        .unwrap();
        assert_eq!(
            url.sentinels,
            vec![("10.0.0.1".into(), 26379), ("::1".into(), 26380)]
        );
        assert_eq!((url.master.as_str(), url.db), ("cache", 2));
        assert_eq!(
            (url.username, url.password.as_deref()),
            (None, Some("s@cret"))
        );
        let list = read(&[
            ("REDIS_SENTINELS", "s1:26379, s2:26379"),
            ("REDIS_PASSWORD", "pw"),
            ("REDIS_SENTINEL_PASSWORD", "spw"),
            ("REDIS_SENTINEL_TLS", "true"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(list.master, "mymaster");
        assert_eq!(list.sentinel_password.as_deref(), Some("spw"));
        assert!(list.tls);
        assert!(
            read(&[("REDIS_URL", "rediss+sentinel://h:1/m")])
                .unwrap()
                .unwrap()
                .tls
        );
        for (vars, name) in [
            (vec![("REDIS_SENTINELS", "s1")], "REDIS_SENTINELS"),
            (vec![("REDIS_SENTINELS", "s1:0")], "REDIS_SENTINELS"),
            (vec![("REDIS_URL", "redis+sentinel://h:1")], "REDIS_URL"),
            (vec![("REDIS_URL", "redis+sentinel://h:1/m/x")], "REDIS_URL"),
            (
                vec![("REDIS_SENTINELS", "s1:1"), ("REDIS_SENTINEL_TLS", "yes")],
                "REDIS_SENTINEL_TLS",
            ),
        ] {
            assert_eq!(read(&vars).map_err(|e| e.0), Err(name), "{vars:?}");
        }
    }
}
