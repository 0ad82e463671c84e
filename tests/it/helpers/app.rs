//! The app under test: served in this process on a free port (`spawn_app`, `TestApp`), or
//! the real `spillway` binary as a process of its own (`AppProcess`), with the keys every
//! test app accepts.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command},
};

use spillway::{config::Config, server, state::AppState};

use super::{PATIENCE, RedisServer, eventually_sync, free_port};

/// The app serving on a free port against `redis`, stopped when dropped.
pub struct TestApp {
    pub addr: SocketAddr,
    /// The Envoy rate limit service (gRPC) of an app served here.
    pub grpc: Option<SocketAddr>,
    pub client: reqwest::Client,
    /// `http`, or `https` for an app whose HTTP port serves TLS (with a `client` that
    /// trusts its certificate).
    pub scheme: &'static str,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl TestApp {
    /// A client for an app served elsewhere (another process).
    pub fn remote(addr: SocketAddr) -> Self {
        spillway::install_tls_provider();
        Self {
            addr,
            grpc: None,
            client: reqwest::Client::new(),
            scheme: "http",
            shutdown: None,
        }
    }

    /// Another handle on the same app (does not stop it when dropped).
    pub fn clone_client(&self) -> Self {
        Self::remote(self.addr)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}://{}{}", self.scheme, self.addr, path)
    }

    /// The text of `GET /metrics`.
    pub async fn metrics(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// `POST /api/v1/check` with the service key.
    pub async fn check(&self, body: serde_json::Value) -> reqwest::Response {
        self.client
            .post(self.url("/api/v1/check"))
            .bearer_auth(SERVICE_KEY)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// A POST of `body` to `path` with the service key: the status and the JSON answer.
    pub async fn post_as_service(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let r = self
            .client
            .post(self.url(path))
            .bearer_auth(SERVICE_KEY)
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }

    /// `method` on `path` with the admin key, with `body` as JSON when there is one.
    pub async fn as_admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> reqwest::Response {
        let request = self
            .client
            .request(method, self.url(path))
            .bearer_auth(ADMIN_KEY);
        match body {
            Some(body) => request.json(body),
            None => request,
        }
        .send()
        .await
        .unwrap()
    }

    /// `GET /api/v1/policies/{name}` with the admin key; panics unless it is found.
    pub async fn get_policy(&self, name: &str) -> serde_json::Value {
        let path = format!("/api/v1/policies/{name}");
        let response = self.as_admin(reqwest::Method::GET, &path, None).await;
        let status = response.status();
        let body: serde_json::Value = response.json().await.unwrap();
        assert!(status.is_success(), "{status}: {body}");
        body
    }

    /// `PUT /api/v1/policies/{name}` with the admin key; panics unless it is stored.
    pub async fn put_policy(&self, name: &str, doc: serde_json::Value) -> serde_json::Value {
        let path = format!("/api/v1/policies/{name}");
        let response = self.as_admin(reqwest::Method::PUT, &path, Some(&doc)).await;
        let status = response.status();
        let body: serde_json::Value = response.json().await.unwrap();
        assert!(status.is_success(), "{status}: {body}");
        body
    }

    /// `DELETE /api/v1/identifiers/{dimension}/{value}?{query}` with the admin key; panics
    /// unless it succeeds. Returns the undo's token.
    pub async fn reset(&self, identifier: &str, query: &str) -> String {
        let (dimension, value) = identifier.split_once('=').expect("dimension=value");
        let path = format!("/api/v1/identifiers/{dimension}/{value}?{query}");
        let response = self.as_admin(reqwest::Method::DELETE, &path, None).await;
        let status = response.status();
        let body: serde_json::Value = response.json().await.unwrap();
        assert!(status.is_success(), "{status}: {body}");
        body["undo"]["token"]
            .as_str()
            .expect("an undo token")
            .to_owned()
    }

    /// `POST /api/v1/resets/{token}/undo` with the admin key; panics unless it succeeds.
    pub async fn undo_reset(&self, token: &str) {
        let path = format!("/api/v1/resets/{token}/undo");
        let response = self.as_admin(reqwest::Method::POST, &path, None).await;
        let status = response.status();
        assert!(
            status.is_success(),
            "{status}: {}",
            response.text().await.unwrap()
        );
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// The service key every test app accepts.
pub const SERVICE_KEY: &str = "spw_svc_test_0123456789abcdef0123456789abcdef";
/// The admin key every test app accepts.
pub const ADMIN_KEY: &str = "spw_adm_test_0123456789abcdef0123456789abcdef";

/// Starts the app on `127.0.0.1:0` against `redis`.
pub async fn spawn_app(redis: &RedisServer) -> TestApp {
    spawn_app_with(redis, &[]).await
}

/// Starts the app with extra configuration variables.
pub async fn spawn_app_with(redis: &RedisServer, extra: &[(&str, &str)]) -> TestApp {
    serve(app_state(redis, extra).await).await
}

/// The app's state as `spawn_app_with` configures it, connected to `redis`.
pub async fn app_state(redis: &RedisServer, extra: &[(&str, &str)]) -> AppState {
    let url = redis.url();
    let extra: Vec<(String, String)> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let config = Config::from_lookup(|name| match name {
        _ if extra.iter().any(|(k, _)| k == name) => extra
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone()),
        "REDIS_URL" => Some(url.clone()),
        "SPILLWAY_SERVICE_KEYS" => Some(SERVICE_KEY.into()),
        "SPILLWAY_ADMIN_KEYS" => Some(ADMIN_KEY.into()),
        "SPILLWAY_REDIS_TIMEOUT_MS" => Some("2000".into()),
        // Alert evaluation (a lease script call each period) only where a test asks for it:
        // tests that count script calls count the checks' own.
        "SPILLWAY_ALERT_EVAL_MS" => Some("3600000".into()),
        _ => None,
    })
    .expect("test configuration is valid");
    AppState::connect(config)
        .await
        .expect("connects to the test redis")
}

/// Serves `state` on a free port until the returned app is dropped.
pub async fn serve(state: AppState) -> TestApp {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    // The gRPC server stops when the HTTP server does (its shutdown handle).
    let grpc_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc = grpc_listener.local_addr().unwrap();
    tokio::spawn(server::serve(listener, Some(grpc_listener), state, async {
        let _ = rx.await;
    }));
    TestApp {
        addr,
        grpc: Some(grpc),
        client: reqwest::Client::new(),
        scheme: "http",
        shutdown: Some(tx),
    }
}

/// The real `spillway` binary as a separate process on a free port, killed on drop.
pub struct AppProcess {
    pub addr: SocketAddr,
    /// Its gRPC port (Envoy's rate limit service).
    pub grpc: SocketAddr,
    child: Child,
    /// Where its standard output (its log) goes.
    log: PathBuf,
}

impl AppProcess {
    pub fn start(redis: &RedisServer) -> Self {
        Self::start_with(redis, &[])
    }

    pub fn start_with(redis: &RedisServer, extra: &[(&str, &str)]) -> Self {
        Self::start_under(redis, extra, &[])
    }

    /// As [`AppProcess::start_with`], the binary started by `wrapper` (for instance
    /// `prlimit --nofile=1024:1024`).
    pub fn start_under(redis: &RedisServer, extra: &[(&str, &str)], wrapper: &[&str]) -> Self {
        let port = free_port();
        // A free port for gRPC too: a `make run` may hold the default 8081.
        let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let binary = env!("CARGO_BIN_EXE_spillway");
        let log =
            std::env::temp_dir().join(format!("spillway-it-{}-{port}.log", std::process::id()));
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        let child = command
            .env("SPILLWAY_ALERT_EVAL_MS", "3600000")
            .env("SPILLWAY_GRPC_ADDR", grpc.to_string())
            .envs(extra.iter().copied())
            .env("REDIS_URL", redis.url())
            .env("LEPTOS_SITE_ADDR", format!("127.0.0.1:{port}"))
            .env("SPILLWAY_SERVICE_KEYS", SERVICE_KEY)
            .env("SPILLWAY_ADMIN_KEYS", ADMIN_KEY)
            .env("SPILLWAY_REDIS_TIMEOUT_MS", "2000")
            .env("RUST_LOG", "warn")
            .stdout(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("the spillway binary is built for the tests");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        // The HTTP port answers while the server starts (health only); the gRPC port is
        // bound once it has: both listening means started.
        let grpc_off = extra
            .iter()
            .any(|(name, value)| *name == "SPILLWAY_GRPC_ADDR" && value.is_empty());
        eventually_sync(
            &format!("spillway listening on {addr} (HTTP) and {grpc} (gRPC)"),
            PATIENCE,
            || {
                (
                    std::net::TcpStream::connect(addr).is_ok(),
                    grpc_off || std::net::TcpStream::connect(grpc).is_ok(),
                )
            },
            |listening| *listening == (true, true),
        );
        Self {
            addr,
            grpc,
            child,
            log,
        }
    }
}

impl AppProcess {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process's resident memory now, in bytes (`VmRSS`).
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect("VmRSS in /proc/<pid>/status")
            * 1024
    }
}

impl Drop for AppProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}
