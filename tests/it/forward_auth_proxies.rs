//! Forward-auth behind the proxies that call it, configured as docs/envoy.md shows: the
//! files of docs/forward-auth/ are read here and run with only their `${…}` placeholders
//! filled in (addresses, ports, the key). A real nginx (`auth_request`, Debian's, installed
//! by `scripts/deps.sh test`) and a real Envoy (`ext_authz`, as tests/it/gateway.rs runs it)
//! stand in front of a small upstream; Traefik's file is only parsed (no Traefik here).

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{
    PATIENCE, RedisServer, SERVICE_KEY, TestApp, clear_of_window_turn, eventually, free_port,
    spawn_app_with,
};

const HOUR: Duration = Duration::from_secs(3600);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A configuration of docs/forward-auth/ as the guide shows it.
fn config(file: &str) -> String {
    let path = root().join("docs/forward-auth").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `file` with every `${NAME}` of `values` filled in; each must be there, and no other
/// may be left.
fn render(file: &str, values: &[(&str, String)]) -> String {
    let mut text = config(file);
    for (name, value) in values {
        let placeholder = format!("${{{name}}}");
        assert!(text.contains(&placeholder), "{file} has no {placeholder}");
        text = text.replace(&placeholder, value);
    }
    let left: Vec<String> = text
        .match_indices("${")
        .map(|(at, _)| text[at..].chars().take(20).collect::<String>())
        .filter(|rest| rest[2..].starts_with(|c: char| c.is_ascii_uppercase()))
        .collect();
    assert!(left.is_empty(), "{file}: placeholders not filled: {left:?}");
    text
}

/// The placeholders of a proxy's file: where it listens, Spillway, the upstream, the key.
fn placeholders(
    listen: u16,
    spillway: SocketAddr,
    app: SocketAddr,
    key: &str,
) -> Vec<(&'static str, String)> {
    vec![
        ("LISTEN_HOST", "127.0.0.1".to_owned()),
        ("LISTEN_PORT", listen.to_string()),
        ("SPILLWAY_HOST", spillway.ip().to_string()),
        ("SPILLWAY_PORT", spillway.port().to_string()),
        ("APP_HOST", app.ip().to_string()),
        ("APP_PORT", app.port().to_string()),
        ("SPILLWAY_KEY", key.to_owned()),
    ]
}

#[test]
fn the_guide_shows_each_configuration_as_the_tests_run_it() {
    let guide = std::fs::read_to_string(root().join("docs/envoy.md")).unwrap();
    for file in ["nginx.conf", "envoy.yaml", "traefik.yaml"] {
        assert!(
            guide.contains(&config(file)),
            "docs/envoy.md does not show docs/forward-auth/{file} as it is: paste it again"
        );
    }
    // Traefik's, which nothing here can run: YAML whose router names only middlewares it
    // defines, the key set before the check and taken off after it.
    let traefik: serde_yaml::Value = serde_yaml::from_str(&config("traefik.yaml")).unwrap();
    let http = &traefik["http"];
    let chain: Vec<&str> = http["routers"]["app"]["middlewares"]
        .as_sequence()
        .expect("the router's middlewares")
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert_eq!(chain, ["spillway-key", "spillway", "spillway-key-off"]);
    for name in &chain {
        assert!(
            http["middlewares"].get(name).is_some(),
            "no middleware {name}"
        );
    }
    let check = &http["middlewares"]["spillway"]["forwardAuth"];
    assert!(
        check["address"]
            .as_str()
            .unwrap()
            .ends_with("/api/v1/forward-auth?policy=web"),
        "{check:?}"
    );
    assert_eq!(check["trustForwardHeader"].as_bool(), Some(false));
}

/// An upstream that answers every request `hello` and keeps each request's head.
struct Upstream {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Upstream {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    seen.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&head).into_owned());
                    let answer =
                        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
                    let _ = socket.write_all(answer.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Self { addr, heads }
    }

    /// The heads of the requests that reached it.
    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// A proxy (nginx or Envoy) running from its rendered configuration on a free port; killed,
/// and its folder removed, when dropped.
struct Proxy {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Proxy {
    /// A folder for a proxy's files.
    fn folder(name: &str, port: u16) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("spillway-{name}-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Runs `command`, whose files are in `dir`, until it accepts on `port`; panics with
    /// what it wrote if it stops first.
    async fn run(mut command: Command, port: u16, dir: PathBuf) -> Self {
        let stderr = dir.join("stderr.log");
        let child = command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("{command:?}: {e}"));
        let mut proxy = Proxy { child, port, dir };
        let started = eventually(
            &format!("{command:?} accepting on port {port}"),
            PATIENCE,
            async || {
                if let Some(status) = proxy.child.try_wait().unwrap() {
                    let said = std::fs::read_to_string(&stderr).unwrap_or_default();
                    return Err(format!("{status}: {said}"));
                }
                Ok(tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok())
            },
            |seen| *seen != Ok(false),
        )
        .await;
        if let Err(stopped) = started {
            panic!("{command:?} stopped: {stopped}");
        }
        proxy
    }

    /// nginx in front of `upstream`, its `auth_request` asking `app` with `key`, configured
    /// by docs/forward-auth/nginx.conf inside a frame of the test's own: one process in the
    /// foreground, its files in its folder, and an access log of each status with
    /// `$spillway_problem`.
    async fn nginx(app: &TestApp, upstream: &Upstream, key: &str) -> Self {
        let mut command = Command::new(nginx_binary());
        let port = free_port();
        let dir = Self::folder("nginx", port);
        let site = render(
            "nginx.conf",
            &placeholders(port, app.addr, upstream.addr, key),
        );
        std::fs::write(dir.join("site.conf"), site).unwrap();
        let d = dir.display();
        let frame = format!(
            "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{ worker_connections 128; }}\n\
             http {{\n\
             \x20   log_format spillway '$status $spillway_problem';\n\
             \x20   access_log {d}/access.log spillway;\n\
             \x20   client_body_temp_path {d}/body;\n    proxy_temp_path {d}/proxy;\n\
             \x20   fastcgi_temp_path {d}/fastcgi;\n    uwsgi_temp_path {d}/uwsgi;\n\
             \x20   scgi_temp_path {d}/scgi;\n\
             \x20   include {d}/site.conf;\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), frame).unwrap();
        command
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .arg("-e")
            .arg(dir.join("error.log"));
        Self::run(command, port, dir).await
    }

    /// Envoy in front of `upstream`, its `ext_authz` asking `app` with `key`, configured by
    /// docs/forward-auth/envoy.yaml as it is.
    async fn envoy(app: &TestApp, upstream: &Upstream, key: &str) -> Self {
        let mut command = Command::new(envoy_binary());
        let port = free_port();
        let dir = Self::folder("envoy", port);
        let file = dir.join("envoy.yaml");
        let config = render(
            "envoy.yaml",
            &placeholders(port, app.addr, upstream.addr, key),
        );
        std::fs::write(&file, config).unwrap();
        command.arg("-c").arg(&file).args([
            "--disable-hot-restart",
            "--concurrency",
            "1",
            "-l",
            "error",
        ]);
        Self::run(command, port, dir).await
    }

    /// Waits until nginx's access log (a line of `$status $spillway_problem` per request,
    /// written once the answer has gone) has a line starting with `line`.
    async fn logged(&self, line: &str) {
        let path = self.dir.join("access.log");
        eventually(
            &format!("a line {line:?} in nginx's access log"),
            PATIENCE,
            async || std::fs::read_to_string(&path).unwrap_or_default(),
            |log| log.lines().any(|l| l.starts_with(line)),
        )
        .await;
    }

    /// A GET of `path` through the proxy with the client's own `headers`.
    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        let mut request =
            reqwest::Client::new().get(format!("http://127.0.0.1:{}{path}", self.port));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.unwrap();
        Answer {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.text().await.unwrap(),
        }
    }
}

/// nginx from the PATH, or where Debian puts it.
fn nginx_binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nginx"))
        .find(|binary| binary.is_file())
        .expect("no nginx on the PATH or in /usr/sbin: run scripts/deps.sh test (make test does)")
}

/// The Envoy `scripts/deps.sh test` installs (tests/it/gateway.rs runs the same).
fn envoy_binary() -> PathBuf {
    let path = root().join(".tools/bin/envoy");
    assert!(
        path.exists(),
        "no Envoy at {}: run scripts/deps.sh test (make test does)",
        path.display()
    );
    path
}

/// What a client got through a proxy.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// `r` of the `RateLimit` header: what the binding rule has left.
    fn remaining(&self) -> Option<u64> {
        self.header("ratelimit")?
            .split(';')
            .find_map(|p| p.trim().strip_prefix("r="))
            .map(|r| r.parse().unwrap())
    }

    /// `Retry-After`, in seconds.
    fn retry_after(&self) -> Option<u64> {
        self.header("retry-after").map(|s| s.parse().unwrap())
    }
}

/// A policy of `limit` requests an hour for each address.
fn an_hour(limit: u64) -> Value {
    json!({"rules": [{"name": "per-hour", "algorithm": "fixed_window", "limit": limit, "window_ms": 3_600_000}]})
}

/// A client's query that tries to name another policy and a cost of nothing.
const SPOOFED_PATH: &str = "/?policy=other&cost=0";

/// A client's headers that try to pass as `address` (another each time) with a key of its
/// own.
fn spoofing(address: &str) -> [(&'static str, &str); 3] {
    [
        ("x-forwarded-for", address),
        ("authorization", "Bearer spw_svc_mine"),
        ("x-spillway-key", "spw_svc_mine"),
    ]
}

/// Through `proxy` (in front of `upstream`, a policy `web` of 3 an hour just stored): three
/// requests reach the upstream with their RateLimit headers, whatever the client wrote, and
/// the fourth is a 429 with Retry-After that does not reach it (returned); the key never
/// does.
async fn three_pass_then_429(proxy: &Proxy, upstream: &Upstream) -> Answer {
    clear_of_window_turn(HOUR).await;
    let before = upstream.heads().len();
    for (i, left) in [2, 1, 0].into_iter().enumerate() {
        let address = format!("203.0.113.{i}");
        let allowed = proxy.get(SPOOFED_PATH, &spoofing(&address)).await;
        assert_eq!(
            (allowed.status, allowed.body.as_str()),
            (200, "hello"),
            "{allowed:?}"
        );
        assert_eq!(allowed.remaining(), Some(left), "{allowed:?}");
        assert_eq!(
            allowed.header("ratelimit-policy"),
            Some("\"per-hour\";q=3;w=3600")
        );
    }
    let denied = proxy.get(SPOOFED_PATH, &spoofing("203.0.113.9")).await;
    assert_eq!(denied.status, 429, "{denied:?}");
    let retry = denied.retry_after().expect("Retry-After on a 429");
    assert!((1..=3600).contains(&retry), "{denied:?}");
    assert_eq!(denied.remaining(), Some(0), "{denied:?}");
    let heads = upstream.heads();
    assert_eq!(
        heads.len() - before,
        3,
        "only the allowed reach the upstream"
    );
    assert!(
        heads.iter().all(|h| !h.contains(SERVICE_KEY)),
        "the proxy's key reached the upstream: {heads:?}"
    );
    denied
}

/// nginx in front of an upstream, as the guide configures it (Spillway's deny status 403,
/// which nginx makes a 429): an unknown policy fails closed with a 500 that the log
/// explains, and then three requests pass and the fourth is a 429, however the client
/// spoofs its address, key or query.
#[tokio::test]
async fn nginx_lets_through_what_spillway_allows_and_answers_429_past_the_limit() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[("SPILLWAY_FORWARD_AUTH_DENY_STATUS", "403")]).await;
    let upstream = Upstream::start().await;
    let nginx = Proxy::nginx(&app, &upstream, SERVICE_KEY).await;
    // No policy named `web` yet: the gate is set up wrong, and nothing gets through.
    let unknown = nginx.get("/", &[("x-forwarded-for", "203.0.113.99")]).await;
    assert_eq!(unknown.status, 500, "{unknown:?}");
    assert!(upstream.heads().is_empty());
    nginx
        .logged("500 unknown-policy; policy: no policy named")
        .await;
    app.put_policy("web", an_hour(3)).await;
    three_pass_then_429(&nginx, &upstream).await;
}

/// What is not a denial stays apart from one through nginx: a proxy with a wrong key gets
/// a 500 (not a 401 asking the client to sign in), and a request refused for what it is a
/// 403 (not a 429). Here nginx's clients come through a load balancer at 127.0.0.1 that
/// Spillway trusts, so the client's `X-Forwarded-For` is believed: an entry that is not an
/// address is refused, and each address has its own limit.
#[tokio::test]
async fn nginx_keeps_a_wrong_key_and_a_refused_request_apart_from_a_denial() {
    let redis = RedisServer::start();
    let app = spawn_app_with(
        &redis,
        &[
            ("SPILLWAY_FORWARD_AUTH_DENY_STATUS", "403"),
            ("SPILLWAY_TRUSTED_PROXIES", "127.0.0.1/32"),
        ],
    )
    .await;
    app.put_policy("web", an_hour(1)).await;
    let upstream = Upstream::start().await;
    let wrong_key = Proxy::nginx(&app, &upstream, "spw_svc_not_a_key_of_this_instance").await;
    let unauthorized = wrong_key.get("/", &[]).await;
    assert_eq!(unauthorized.status, 500, "{unauthorized:?}");
    wrong_key.logged("500 unauthorized; ").await;
    let nginx = Proxy::nginx(&app, &upstream, SERVICE_KEY).await;
    let refused = nginx
        .get("/", &[("x-forwarded-for", "not-an-address")])
        .await;
    assert_eq!(refused.status, 403, "{refused:?}");
    assert_eq!(refused.retry_after(), None);
    clear_of_window_turn(HOUR).await;
    let mut statuses = Vec::new();
    for ip in ["198.51.100.9", "198.51.100.9", "198.51.100.10"] {
        statuses.push(nginx.get("/", &[("x-forwarded-for", ip)]).await.status);
    }
    assert_eq!(statuses, [200, 429, 200], "each address has its own limit");
    assert_eq!(upstream.heads().len(), 2);
}

/// Envoy's ext_authz in front of an upstream, as the guide configures it (Spillway's
/// statuses as they are): an unknown policy fails closed with a 500; three requests pass
/// and the fourth is Spillway's own 429, however the client spoofs its address, key or
/// query; and a proxy with a wrong key passes Spillway's 401 on, saying why.
#[tokio::test]
async fn envoy_lets_through_what_spillway_allows_and_passes_its_429_on() {
    let redis = RedisServer::start();
    let app = spawn_app_with(&redis, &[]).await;
    let upstream = Upstream::start().await;
    let envoy = Proxy::envoy(&app, &upstream, SERVICE_KEY).await;
    let unknown = envoy.get("/", &[("x-forwarded-for", "203.0.113.99")]).await;
    assert_eq!(unknown.status, 500, "{unknown:?}");
    assert!(upstream.heads().is_empty());
    app.put_policy("web", an_hour(3)).await;
    let denied = three_pass_then_429(&envoy, &upstream).await;
    let body: Value = serde_json::from_str(&denied.body).expect("Spillway's answer");
    assert_eq!(body["allowed"], false, "{body}");
    let wrong_key = Proxy::envoy(&app, &upstream, "spw_svc_not_a_key_of_this_instance").await;
    let unauthorized = wrong_key.get("/", &[]).await;
    assert_eq!(unauthorized.status, 401, "{unauthorized:?}");
    let problem = unauthorized.header("spillway-problem").unwrap_or_default();
    assert!(problem.starts_with("unauthorized; "), "{unauthorized:?}");
    assert_eq!(upstream.heads().len(), 3);
}
