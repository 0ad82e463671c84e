//! Redis over TLS (`rediss://`), with a CA of the test's own making.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::json;

use crate::helpers::{PATIENCE, RedisServer, eventually_sync, free_port, spawn_app_with};

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stderr(Stdio::null())
        .status()
        .expect("openssl is installed");
    assert!(status.success(), "openssl {args:?}");
}

/// A CA and a server certificate for 127.0.0.1, in `dir`.
fn make_certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=spillway-test-ca",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(dir.join("ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "ext",
        ],
    );
}

/// A redis-server on a TLS port of its own, stopped when dropped.
pub(crate) struct TlsRedis {
    child: Child,
    pub port: u16,
}

impl TlsRedis {
    /// Serves with the PEM files `cert` and `key`, trusting `ca` for clients, and asking them
    /// for a certificate when `ask_clients`; returns once the port accepts.
    pub(crate) fn start(cert: &str, key: &str, ca: &str, ask_clients: bool) -> Self {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--tls-cert-file", cert, "--tls-key-file", key])
            .args(["--tls-ca-cert-file", ca])
            .args(["--tls-auth-clients", if ask_clients { "yes" } else { "no" }])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let redis = Self { child, port };
        let _listening = eventually_sync(
            "the TLS redis-server listening",
            PATIENCE,
            || std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string()),
            Result::is_ok,
        );
        redis
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn checks_work_over_tls_with_a_private_ca() {
    let plain = RedisServer::start(); // only to satisfy spawn_app_with's signature
    let dir = std::env::temp_dir().join(format!("spillway-tls-{}", plain.port));
    std::fs::create_dir_all(&dir).unwrap();
    make_certificates(&dir);
    let server = TlsRedis::start(
        dir.join("server.crt").to_str().unwrap(),
        dir.join("server.key").to_str().unwrap(),
        dir.join("ca.crt").to_str().unwrap(),
        false,
    );
    let port = server.port;
    let url = format!("rediss://127.0.0.1:{port}");
    let ca = dir.join("ca.crt");
    let app = spawn_app_with(
        &plain,
        &[("REDIS_URL", &url), ("REDIS_CA_CERT", ca.to_str().unwrap())],
    )
    .await;
    app.put_policy("tls", json!({"rules": [{"name": "r", "algorithm": "gcra", "rate": 1, "period_ms": 60000, "burst": 1}]})).await;
    for expected in [200, 200, 429] {
        let status = app
            .check(json!({"policy": "tls", "identifiers": {"user": "1"}}))
            .await
            .status();
        assert_eq!(status, expected);
    }
    // The plain server saw nothing: everything went over TLS.
    let mut conn = plain.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert!(keys.is_empty(), "{keys:?}");

    // Without the CA, the certificate is not trusted and nothing connects.
    let untrusted = spillway::store::Store::connect_tls(
        &url,
        None,
        Duration::from_secs(2),
        spillway::store::Keys::default(),
    )
    .await;
    assert!(
        untrusted.is_err(),
        "a certificate from an unknown CA was accepted"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
