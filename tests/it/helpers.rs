//! Test fixtures: a `redis-server` each test owns, and the app served on a free port.

use std::{
    net::{SocketAddr, TcpListener},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use spillway::{config::Config, server, state::AppState};

/// Returns a TCP port nobody is listening on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A `redis-server` owned by one test: its own port and directory, killed on drop.
pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a fresh server and waits until it answers.
    pub fn start() -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("spillway-it-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = Self { port, dir, child: None };
        server.restart();
        server
    }

    /// `redis://` URL of this server.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty: no persistence).
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (make test installs it)");
        self.child = Some(child);
        self.wait_until_up();
    }

    fn wait_until_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = redis::Client::open(self.url()).unwrap();
        while Instant::now() < deadline {
            if let Ok(mut conn) = client.get_connection() {
                if redis::cmd("PING").query::<String>(&mut conn).is_ok() {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} did not come up", self.port);
    }

    /// A plain synchronous connection for inspecting what the app wrote.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url()).unwrap().get_connection().unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The app serving on a free port against `redis`, stopped when dropped.
pub struct TestApp {
    pub addr: SocketAddr,
    pub client: reqwest::Client,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Starts the app on `127.0.0.1:0` against `redis`.
pub async fn spawn_app(redis: &RedisServer) -> TestApp {
    let url = redis.url();
    let config = Config::from_lookup(|name| match name {
        "REDIS_URL" => Some(url.clone()),
        // The test binary runs from the crate root; no Leptos.toml override needed.
        _ => None,
    })
    .expect("test configuration is valid");
    let state = AppState::connect(config).await.expect("connects to the test redis");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server::run(listener, state, async {
        let _ = rx.await;
    }));
    TestApp { addr, client: reqwest::Client::new(), shutdown: Some(tx) }
}
