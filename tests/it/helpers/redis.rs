//! Redis for the tests: a `redis-server` each test owns (killed and restarted at will), and
//! a local three-master Redis Cluster.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
};

use super::{PATIENCE, eventually_sync, free_port, free_ports};

/// Waits until a redis-server answers PING on `port`.
fn wait_for_redis(port: u16) {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let _pong = eventually_sync(
        &format!("redis-server answering PING on port {port}"),
        PATIENCE,
        || {
            client
                .get_connection()
                .and_then(|mut conn| redis::cmd("PING").query::<String>(&mut conn))
                .map_err(|e| e.to_string())
        },
        Result::is_ok,
    );
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
        let mut server = Self {
            port,
            dir,
            child: None,
        };
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
        wait_for_redis(self.port);
    }

    /// Pauses every client of this Redis for `ms` (`CLIENT PAUSE`): calls wait, none fail.
    pub fn pause(&self, ms: u64) {
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(ms)
            .query(&mut self.connection())
            .unwrap();
    }

    /// Whether this Redis answers a PING within 200 ms now (not while it is paused).
    pub fn answers(&self) -> bool {
        let timeout = std::time::Duration::from_millis(200);
        let Ok(mut conn) = redis::Client::open(self.url())
            .unwrap()
            .get_connection_with_timeout(timeout)
        else {
            return false;
        };
        conn.set_read_timeout(Some(timeout)).unwrap();
        redis::cmd("PING").query::<String>(&mut conn).is_ok()
    }

    /// A plain synchronous connection for inspecting what the app wrote.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// How many script calls (EVAL and EVALSHA) this Redis has run since its statistics
    /// were last reset (`CONFIG RESETSTAT`).
    pub fn script_calls(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.connection())
            .unwrap();
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| l.split([':', ',']).find_map(|kv| kv.strip_prefix("calls=")))
            .map(|n| n.parse::<u64>().unwrap())
            .sum()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A local Redis Cluster of three masters on free ports, torn down on drop.
pub struct RedisCluster {
    pub ports: Vec<u16>,
    dir: PathBuf,
    children: Vec<Child>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers, joins them and waits for `cluster_state:ok`.
    ///
    /// Each node's cluster bus gets a free port of its own (`--cluster-port`): by default it
    /// is the node's port plus 10000, which nobody checked was free (another process may
    /// hold it) and which does not exist for a port above 55535.
    pub fn start() -> Self {
        let mut chosen = free_ports(6);
        let buses = chosen.split_off(3);
        let ports = chosen;
        let dir = std::env::temp_dir().join(format!(
            "spillway-cluster-{}-{}",
            std::process::id(),
            ports[0]
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let children = ports
            .iter()
            .zip(&buses)
            .map(|(port, bus)| {
                Command::new("redis-server")
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args([
                        "--cluster-enabled",
                        "yes",
                        "--cluster-port",
                        &bus.to_string(),
                        "--cluster-config-file",
                        &format!("nodes-{port}.conf"),
                    ])
                    .args(["--save", "", "--appendonly", "no"])
                    .arg("--dir")
                    .arg(&dir)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("redis-server must be installed")
            })
            .collect();
        let cluster = Self {
            ports,
            dir,
            children,
        };
        for port in &cluster.ports {
            wait_for_redis(*port);
        }
        let nodes: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("redis-cli must be installed");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster_info = |port: u16| -> String {
            let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                .unwrap()
                .get_connection()
                .unwrap();
            redis::cmd("CLUSTER").arg("INFO").query(&mut conn).unwrap()
        };
        eventually_sync(
            "the nodes not yet at cluster_state:ok",
            PATIENCE,
            || {
                cluster
                    .ports
                    .iter()
                    .copied()
                    .filter(|port| !cluster_info(*port).contains("cluster_state:ok"))
                    .collect::<Vec<u16>>()
            },
            Vec::is_empty,
        );
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
