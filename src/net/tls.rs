//! TLS and mutual TLS on the HTTP and gRPC ports (rustls, ring). A port's certificate, key
//! and optional client CA are PEM files; a client CA makes client certificates required.
//! The files are read again every second, and a change that loads is in force for the next
//! connection: connections already open keep the configuration they began with, so a
//! renewed certificate (cert-manager, a Kubernetes secret's symlink swap) drops nothing. A
//! change that does not load (a key written before its certificate) leaves the previous
//! configuration in force and is logged once.

use std::{
    io,
    path::PathBuf,
    pin::Pin,
    sync::{Arc, RwLock},
    task::{Context, Poll},
    time::Duration,
};

use rustls::{
    RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::WebPkiClientVerifier,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How often the files are read again.
pub const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// One file of a port's TLS: the variable that named it, for errors, and its path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct File {
    pub setting: &'static str,
    pub path: PathBuf,
}

/// The files of one port's TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Files {
    /// The certificate chain, the server's own certificate first.
    pub cert: File,
    pub key: File,
    /// The CAs a client certificate must chain to; set, a client without one is refused.
    pub client_ca: Option<File>,
}

/// A setting that cannot be used: the variable and what is wrong.
pub type Problem = (&'static str, String);

/// The names of one port's variables.
struct Names {
    cert: &'static str,
    key: &'static str,
    client_ca: &'static str,
}

const SHARED: Names = Names {
    cert: "SPILLWAY_TLS_CERT_FILE",
    key: "SPILLWAY_TLS_KEY_FILE",
    client_ca: "SPILLWAY_TLS_CLIENT_CA_FILE",
};
const HTTP: Names = Names {
    cert: "SPILLWAY_HTTP_TLS_CERT_FILE",
    key: "SPILLWAY_HTTP_TLS_KEY_FILE",
    client_ca: "SPILLWAY_HTTP_TLS_CLIENT_CA_FILE",
};
const GRPC: Names = Names {
    cert: "SPILLWAY_GRPC_TLS_CERT_FILE",
    key: "SPILLWAY_GRPC_TLS_KEY_FILE",
    client_ca: "SPILLWAY_GRPC_TLS_CLIENT_CA_FILE",
};

/// The TLS of both ports, loaded: `None` serves that port in plaintext.
#[derive(Clone, Default)]
pub struct Ports {
    pub http: Option<Arc<Port>>,
    pub grpc: Option<Arc<Port>>,
}

impl Ports {
    /// Reads the settings through `lookup` and loads the files they name. `SPILLWAY_TLS_*`
    /// applies to both ports; `SPILLWAY_HTTP_TLS_*` and `SPILLWAY_GRPC_TLS_*` to one, over
    /// the shared value (so a client CA can be required on the gRPC port alone, leaving the
    /// dashboard to browsers without client certificates).
    pub fn from_lookup(lookup: &impl Fn(&str) -> Option<String>) -> Result<Self, Problem> {
        let http = files(lookup, &HTTP)?.map(|f| Port::load(f, &[b"h2", b"http/1.1"]));
        let grpc = files(lookup, &GRPC)?.map(|f| Port::load(f, &[b"h2"]));
        Ok(Self {
            http: http.transpose()?.map(Arc::new),
            grpc: grpc.transpose()?.map(Arc::new),
        })
    }

    /// Re-reads every port's files each [`RELOAD_EVERY`], for ever (the server's shutdown
    /// handle runs it, and ends it).
    pub async fn watch(self) {
        let ports: Vec<Arc<Port>> = self.http.into_iter().chain(self.grpc).collect();
        if ports.is_empty() {
            return;
        }
        let mut tick = tokio::time::interval(RELOAD_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for port in &ports {
                let port = port.clone();
                // Reading files blocks: off the runtime's threads.
                let _ = tokio::task::spawn_blocking(move || port.reload_logged()).await;
            }
        }
    }
}

/// One port's files: its own variables over the shared ones; `None` when no certificate is
/// set for it.
fn files(lookup: &impl Fn(&str) -> Option<String>, port: &Names) -> Result<Option<Files>, Problem> {
    let set = |name: &'static str| {
        lookup(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .map(|path| File {
                setting: name,
                path: path.into(),
            })
    };
    let either = |own: &'static str, shared: &'static str| set(own).or_else(|| set(shared));
    let cert = either(port.cert, SHARED.cert);
    let key = either(port.key, SHARED.key);
    let client_ca = either(port.client_ca, SHARED.client_ca);
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(Files {
            cert,
            key,
            client_ca,
        })),
        (None, None) => match client_ca {
            Some(ca) => Err((
                ca.setting,
                format!(
                    "a client CA needs a certificate and key to serve TLS with ({} and {}, \
                     or {} and {})",
                    SHARED.cert, SHARED.key, port.cert, port.key
                ),
            )),
            None => Ok(None),
        },
        (Some(cert), None) => Err((
            port.key,
            format!(
                "{} is set, so a key is needed too ({} or {})",
                cert.setting, SHARED.key, port.key
            ),
        )),
        (None, Some(key)) => Err((
            port.cert,
            format!(
                "{} is set, so a certificate is needed too ({} or {})",
                key.setting, SHARED.cert, port.cert
            ),
        )),
    }
}

/// One port's TLS: the configuration made from its files, replaced when they change.
pub struct Port {
    files: Files,
    alpn: Vec<Vec<u8>>,
    current: RwLock<Loaded>,
    /// The last problem logged, so one that lasts is logged once.
    logged: std::sync::Mutex<Option<String>>,
}

/// A configuration and the file contents it was made from.
struct Loaded {
    config: Arc<ServerConfig>,
    contents: Contents,
    /// The contents of the latest change that failed to load, so it is logged once.
    rejected: Option<Contents>,
}

/// What the files held: certificate, key, client CA.
type Contents = (Vec<u8>, Vec<u8>, Option<Vec<u8>>);

impl Port {
    /// Loads `files`, offering `alpn` (the protocols the port speaks, preferred first).
    pub fn load(files: Files, alpn: &[&[u8]]) -> Result<Self, Problem> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let contents = read(&files)?;
        let config = Arc::new(server_config(&files, &contents, &alpn)?);
        Ok(Self {
            files,
            alpn,
            current: RwLock::new(Loaded {
                config,
                contents,
                rejected: None,
            }),
            logged: Default::default(),
        })
    }

    /// Whether clients must show a certificate.
    pub fn requires_client_certificates(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// The configuration new connections get.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .config
            .clone()
    }

    /// Reads the files again: `Ok(true)` when they changed and the change is now in force,
    /// `Ok(false)` when nothing changed (or the change was refused before), an error when a
    /// change does not load (the previous configuration stays).
    pub fn reload(&self) -> Result<bool, Problem> {
        let contents = read(&self.files)?;
        {
            let current = self.current.read().unwrap_or_else(|e| e.into_inner());
            if current.contents == contents || current.rejected.as_ref() == Some(&contents) {
                return Ok(false);
            }
        }
        let made = server_config(&self.files, &contents, &self.alpn);
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        match made {
            Ok(config) => {
                *current = Loaded {
                    config: Arc::new(config),
                    contents,
                    rejected: None,
                };
                Ok(true)
            }
            Err(problem) => {
                current.rejected = Some(contents);
                Err(problem)
            }
        }
    }

    /// [`Port::reload`], saying what happened in the log (a problem once, while it lasts).
    fn reload_logged(&self) {
        let outcome = self.reload();
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        match outcome {
            Ok(true) => {
                *logged = None;
                tracing::info!(
                    cert = %self.files.cert.path.display(),
                    "TLS files changed: new connections use them"
                );
            }
            Ok(false) => {}
            Err((setting, problem)) => {
                if logged.as_deref() != Some(problem.as_str()) {
                    tracing::error!(
                        setting,
                        "TLS files changed but do not load, the previous ones stay in force: {problem}"
                    );
                    *logged = Some(problem);
                }
            }
        }
    }
}

/// The files' contents. A file that cannot be read names its setting.
fn read(files: &Files) -> Result<Contents, Problem> {
    let one = |file: &File| {
        std::fs::read(&file.path).map_err(|e| {
            (
                file.setting,
                format!("reading {}: {e}", file.path.display()),
            )
        })
    };
    Ok((
        one(&files.cert)?,
        one(&files.key)?,
        files.client_ca.as_ref().map(one).transpose()?,
    ))
}

/// A rustls server configuration from the files' contents.
fn server_config(
    files: &Files,
    (cert, key, client_ca): &Contents,
    alpn: &[Vec<u8>],
) -> Result<ServerConfig, Problem> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let in_file = |file: &File, problem: String| {
        (file.setting, format!("{}: {problem}", file.path.display()))
    };
    let chain = certificates(cert).map_err(|p| in_file(&files.cert, p))?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
        in_file(
            &files.key,
            format!("no private key read (PKCS#8, PKCS#1 or SEC1 PEM): {e}"),
        )
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| (files.cert.setting, e.to_string()))?;
    let builder = match (&files.client_ca, client_ca) {
        (Some(file), Some(pem)) => {
            let mut roots = RootCertStore::empty();
            for ca in certificates(pem).map_err(|p| in_file(file, p))? {
                roots
                    .add(ca)
                    .map_err(|e| in_file(file, format!("not a CA certificate: {e}")))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| in_file(file, e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        (
            files.key.setting,
            format!(
                "{} and {} do not make a certificate and its key: {e}",
                files.cert.path.display(),
                files.key.path.display()
            ),
        )
    })?;
    config.alpn_protocols = alpn.to_vec();
    Ok(config)
}

/// Every certificate of a PEM file; at least one.
fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate: {e}"))?;
    if chain.is_empty() {
        return Err("holds no certificate (PEM, BEGIN CERTIFICATE)".into());
    }
    Ok(chain)
}

/// An accepted connection: plaintext, or TLS once its handshake is done.
pub enum Socket {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Socket {
    /// `stream` as the port serves it: as it is without TLS, or after a handshake that must
    /// end within `within` (a client that stalls it holds no task for longer).
    pub async fn accept(
        stream: TcpStream,
        tls: Option<&Port>,
        within: Duration,
    ) -> io::Result<Self> {
        let Some(port) = tls else {
            return Ok(Self::Plain(stream));
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(port.config());
        match tokio::time::timeout(within, acceptor.accept(stream)).await {
            Ok(accepted) => Ok(Self::Tls(Box::new(accepted?))),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the TLS handshake took longer than the header read timeout",
            )),
        }
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, data),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, data),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn each_port_takes_its_own_files_over_the_shared_ones() {
        let read = |pairs: &[(&str, &str)]| {
            let l = lookup(pairs);
            (files(&l, &HTTP).unwrap(), files(&l, &GRPC).unwrap())
        };
        assert_eq!(read(&[]), (None, None));
        let (http, grpc) = read(&[
            ("SPILLWAY_TLS_CERT_FILE", "c.pem"),
            ("SPILLWAY_TLS_KEY_FILE", "k.pem"),
            ("SPILLWAY_GRPC_TLS_CLIENT_CA_FILE", "ca.pem"),
        ]);
        let (http, grpc) = (http.unwrap(), grpc.unwrap());
        assert_eq!(http.cert.path, PathBuf::from("c.pem"));
        assert_eq!(http.client_ca, None);
        assert_eq!(grpc.key.setting, "SPILLWAY_TLS_KEY_FILE");
        assert_eq!(
            grpc.client_ca.unwrap().setting,
            "SPILLWAY_GRPC_TLS_CLIENT_CA_FILE"
        );
        let (http, grpc) = read(&[
            ("SPILLWAY_GRPC_TLS_CERT_FILE", "g.pem"),
            ("SPILLWAY_GRPC_TLS_KEY_FILE", "gk.pem"),
        ]);
        assert_eq!(http, None);
        assert_eq!(grpc.unwrap().cert.setting, "SPILLWAY_GRPC_TLS_CERT_FILE");
    }

    #[test]
    fn half_a_setting_names_what_is_missing() {
        let l = lookup(&[("SPILLWAY_TLS_CERT_FILE", "c.pem")]);
        let (setting, problem) = files(&l, &HTTP).unwrap_err();
        assert_eq!(setting, "SPILLWAY_HTTP_TLS_KEY_FILE");
        assert!(problem.contains("SPILLWAY_TLS_KEY_FILE"), "{problem}");
        let l = lookup(&[("SPILLWAY_TLS_CLIENT_CA_FILE", "ca.pem")]);
        assert_eq!(
            files(&l, &GRPC).unwrap_err().0,
            "SPILLWAY_TLS_CLIENT_CA_FILE"
        );
    }

    #[test]
    fn a_missing_or_foreign_file_names_its_setting() {
        let dir = std::env::temp_dir().join(format!("spillway-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_pem = dir.join("not.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        let l = lookup(&[
            ("SPILLWAY_TLS_CERT_FILE", not_pem.to_str().unwrap()),
            ("SPILLWAY_TLS_KEY_FILE", "/nonexistent/key.pem"),
        ]);
        let Err((setting, problem)) = Ports::from_lookup(&l) else {
            panic!("loaded")
        };
        assert_eq!(setting, "SPILLWAY_TLS_KEY_FILE");
        assert!(problem.contains("/nonexistent/key.pem"), "{problem}");
        let l = lookup(&[
            ("SPILLWAY_TLS_CERT_FILE", not_pem.to_str().unwrap()),
            ("SPILLWAY_TLS_KEY_FILE", not_pem.to_str().unwrap()),
        ]);
        let Err((setting, problem)) = Ports::from_lookup(&l) else {
            panic!("loaded")
        };
        assert_eq!(setting, "SPILLWAY_TLS_CERT_FILE");
        assert!(problem.contains("no certificate"), "{problem}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
