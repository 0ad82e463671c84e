//! TLS and mutual TLS on Spillway's own ports (`SPILLWAY_TLS_*`), with certificates the test
//! makes (rcgen): HTTPS on the HTTP port, client certificates required on the gRPC port, and
//! a certificate renewed while a connection stays open. Envoy calling the gRPC port over mTLS
//! is in `gateway.rs`.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

use crate::{
    envoy::{OK, OVER, descriptor, load, request},
    helpers::{RedisServer, SERVICE_KEY, TestApp, eventually, spawn_app_with},
};

/// A CA of the test's own, and what it signs.
pub(crate) struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub pem: String,
}

/// A certificate and its key, in PEM.
pub(crate) struct Signed {
    pub cert: String,
    pub key: String,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Self {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A server certificate for 127.0.0.1 and localhost.
    pub fn server(&self) -> Signed {
        self.sign(LOCAL.to_vec(), &[ExtendedKeyUsagePurpose::ServerAuth])
    }

    /// A client certificate.
    pub fn client(&self, name: &str) -> Signed {
        self.sign(vec![name], &[ExtendedKeyUsagePurpose::ClientAuth])
    }

    /// A certificate for 127.0.0.1 and localhost good for both ends, as Envoy Gateway's
    /// one certificate serves its rate limit service's gRPC port and its xDS client.
    pub fn server_and_client(&self) -> Signed {
        self.sign(
            LOCAL.to_vec(),
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    fn sign(&self, names: Vec<&str>, usages: &[ExtendedKeyUsagePurpose]) -> Signed {
        let names: Vec<String> = names.into_iter().map(str::to_owned).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.extended_key_usages = usages.to_vec();
        let key = KeyPair::generate().unwrap();
        Signed {
            cert: params.signed_by(&key, &self.issuer).unwrap().pem(),
            key: key.serialize_pem(),
        }
    }
}

/// The names a local server's certificate holds.
const LOCAL: [&str; 2] = ["localhost", "127.0.0.1"];

/// A folder of PEM files, removed on drop.
pub(crate) struct Folder(pub PathBuf);

impl Folder {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "spillway-{name}-{}-{}",
            std::process::id(),
            crate::helpers::free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// Writes `text` to `name` in the folder; its path.
    pub fn write(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A rustls client configuration trusting `ca`, offering `alpn`, showing `identity` if given.
fn client_config(ca: &str, alpn: &[&[u8]], identity: Option<&Signed>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut config = match identity {
        Some(id) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(id.cert.as_bytes())
                    .map(Result::unwrap)
                    .collect(),
                PrivateKeyDer::from_pem_slice(id.key.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// An HTTPS client (HTTP/1.1) trusting `ca`.
fn https(ca: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .use_preconfigured_tls(client_config(ca, &[b"http/1.1"], None))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// A gRPC-over-TLS client (HTTP/2) trusting `ca`, showing `identity` if given.
fn grpc_client(ca: &str, identity: Option<&Signed>) -> reqwest::Client {
    reqwest::Client::builder()
        .use_preconfigured_tls(client_config(ca, &[b"h2"], identity))
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// `ShouldRateLimit` over `client`, with the service key: the answer, or the transport's
/// error (a refused handshake).
async fn should_rate_limit(
    client: &reqwest::Client,
    grpc: SocketAddr,
    message: RateLimitRequest,
) -> Result<RateLimitResponse, reqwest::Error> {
    let encoded = message.encode_to_vec();
    let mut body = vec![0];
    body.extend((encoded.len() as u32).to_be_bytes());
    body.extend(encoded);
    let answer = client
        .post(format!(
            "https://127.0.0.1:{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            grpc.port()
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("x-spillway-key", SERVICE_KEY)
        .body(body)
        .send()
        .await?;
    let bytes = answer.bytes().await?;
    assert!(bytes.len() > 5, "a gRPC message: {bytes:?}");
    Ok(RateLimitResponse::decode(&bytes[5..]).unwrap())
}

async fn status_of(client: &reqwest::Client, app: &TestApp, path: &str) -> Option<u16> {
    client
        .get(format!("https://127.0.0.1:{}{path}", app.addr.port()))
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16())
}

fn exists(path: &str) -> bool {
    Path::new(path).exists()
}

#[tokio::test]
async fn https_on_the_http_port_and_client_certificates_required_on_the_grpc_port() {
    let redis = RedisServer::start();
    let ca = Ca::new("spillway test CA");
    let server = ca.server();
    let files = Folder::new("port-tls");
    let (cert, key) = (
        files.write("tls.crt", &server.cert),
        files.write("tls.key", &server.key),
    );
    let client_ca = files.write("client-ca.crt", &ca.pem);
    assert!(exists(&cert) && exists(&key));
    let mut app = spawn_app_with(
        &redis,
        &[
            ("SPILLWAY_TLS_CERT_FILE", &cert),
            ("SPILLWAY_TLS_KEY_FILE", &key),
            ("SPILLWAY_GRPC_TLS_CLIENT_CA_FILE", &client_ca),
        ],
    )
    .await;
    app.scheme = "https";
    app.client = https(&ca.pem);
    let grpc = app.grpc.unwrap();

    // The HTTP port speaks HTTPS, and only HTTPS.
    assert_eq!(status_of(&app.client, &app, "/healthz").await, Some(200));
    let plain = reqwest::Client::new()
        .get(format!("http://{}/healthz", app.addr))
        .send()
        .await;
    assert!(plain.is_err(), "plaintext on a TLS port: {plain:?}");
    // The gRPC port: a client certificate from the CA gets answers; none, or one from
    // another CA, gets no answer at all.
    load(
        &app,
        "tls",
        "domain: tls\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
    )
    .await;
    let ask = || request("tls", vec![descriptor(&[("user", "alice")])]);
    let trusted = grpc_client(&ca.pem, Some(&ca.client("envoy")));
    let codes: Vec<i32> = {
        let mut codes = Vec::new();
        for _ in 0..3 {
            let answer = should_rate_limit(&trusted, grpc, ask()).await.unwrap();
            codes.push(answer.overall_code);
        }
        codes
    };
    assert_eq!(codes, [OK, OK, OVER]);
    let anonymous = should_rate_limit(&grpc_client(&ca.pem, None), grpc, ask()).await;
    assert!(anonymous.is_err(), "no client certificate: {anonymous:?}");
    let stranger = Ca::new("someone else's CA");
    let foreign = should_rate_limit(
        &grpc_client(&ca.pem, Some(&stranger.client("mallory"))),
        grpc,
        ask(),
    )
    .await;
    assert!(foreign.is_err(), "a certificate of another CA: {foreign:?}");
    // Plaintext gRPC on the TLS port is refused too.
    let plain = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap()
        .post(format!(
            "http://{grpc}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        ))
        .header("content-type", "application/grpc")
        .send()
        .await;
    assert!(plain.is_err(), "plaintext gRPC on a TLS port: {plain:?}");
}

#[tokio::test]
async fn a_renewed_certificate_is_used_for_new_connections_and_drops_no_open_one() {
    let redis = RedisServer::start();
    let old_ca = Ca::new("old CA");
    let old = old_ca.server();
    let files = Folder::new("port-tls-renewal");
    let (cert, key) = (
        files.write("tls.crt", &old.cert),
        files.write("tls.key", &old.key),
    );
    let app = spawn_app_with(
        &redis,
        &[
            ("SPILLWAY_TLS_CERT_FILE", &cert),
            ("SPILLWAY_TLS_KEY_FILE", &key),
            // Idle connections are kept for the whole test.
            ("SPILLWAY_HEADER_READ_TIMEOUT_MS", "60000"),
        ],
    )
    .await;
    // One client keeps its connection open across the renewal.
    let open = https(&old_ca.pem);
    assert_eq!(status_of(&open, &app, "/healthz").await, Some(200));

    // Half a renewal (the new key before its certificate) loads nothing: the old
    // certificate stays in force for new connections.
    let new_ca = Ca::new("new CA");
    let new = new_ca.server();
    std::fs::write(&key, &new.key).unwrap();
    // A negative check: two reloads pass (nothing outside the process shows one) and the
    // old certificate is still served.
    tokio::time::sleep(spillway::net::tls::RELOAD_EVERY * 2 + Duration::from_millis(500)).await;
    assert_eq!(
        status_of(&https(&old_ca.pem), &app, "/healthz").await,
        Some(200),
        "a key without its certificate replaced the old pair"
    );

    // The certificate follows: new connections get it within two seconds or so.
    std::fs::write(&cert, &new.cert).unwrap();
    eventually(
        "the renewed certificate served",
        Duration::from_secs(5),
        async || status_of(&https(&new_ca.pem), &app, "/healthz").await,
        |status| *status == Some(200),
    )
    .await;
    assert_eq!(
        status_of(&https(&old_ca.pem), &app, "/healthz").await,
        None,
        "a new connection still got the old certificate"
    );
    // The connection opened before the renewal still answers (a new one under the old CA
    // could not, as just seen).
    assert_eq!(status_of(&open, &app, "/healthz").await, Some(200));
}

#[tokio::test]
async fn a_certificate_that_does_not_load_stops_the_start_naming_its_setting() {
    let ca = Ca::new("CA");
    let one = ca.server();
    let other = ca.server();
    let files = Folder::new("port-tls-bad");
    let cert = files.write("tls.crt", &one.cert);
    let wrong_key = files.write("tls.key", &other.key);
    let read = |pairs: Vec<(&'static str, String)>| {
        spillway::config::Config::from_lookup(|name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
        })
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
    };
    let mismatch = read(vec![
        ("SPILLWAY_TLS_CERT_FILE", cert.clone()),
        ("SPILLWAY_TLS_KEY_FILE", wrong_key),
    ]);
    assert!(
        mismatch.starts_with("SPILLWAY_TLS_KEY_FILE: ") && mismatch.contains("do not make"),
        "{mismatch}"
    );
    // A port with TLS marks its session cookies Secure without X-Forwarded-Proto.
    let good = spillway::config::Config::from_lookup(|name| match name {
        "SPILLWAY_TLS_CERT_FILE" => Some(cert.clone()),
        "SPILLWAY_TLS_KEY_FILE" => Some(files.write("good.key", &one.key)),
        _ => None,
    })
    .map_err(|e| e.to_string())
    .unwrap();
    assert!(good.sessions.secure_cookies);
    let missing = read(vec![
        ("SPILLWAY_GRPC_TLS_CERT_FILE", cert),
        ("SPILLWAY_GRPC_TLS_KEY_FILE", "/nonexistent/tls.key".into()),
    ]);
    assert!(
        missing.starts_with("SPILLWAY_GRPC_TLS_KEY_FILE: reading /nonexistent/tls.key"),
        "{missing}"
    );
}
