//! Where domains come from over xDS (state of the world): the management server and how to
//! reach it (`SPILLWAY_XDS_*`, which upstream's `CONFIG_GRPC_XDS_*` set), for the xDS
//! client front door.

use std::path::PathBuf;

/// A setting that cannot be used: the variable and what is wrong.
pub type Problem = (&'static str, String);

/// The management server and this instance's node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdsSettings {
    /// `http://host:port`, or `https://host:port` for TLS.
    pub server: String,
    /// The node id sent with every request (`SPILLWAY_XDS_NODE_ID`, default `spillway`).
    pub node_id: String,
    /// The node's metadata (`SPILLWAY_XDS_NODE_METADATA`, `key=value` pairs, comma-separated).
    pub node_metadata: Vec<(String, String)>,
    /// The CA that signed the server's certificate (`SPILLWAY_XDS_TLS_CA_FILE`; default the
    /// web's roots).
    pub ca: Option<PathBuf>,
    /// This client's certificate and key, for a server that requires them
    /// (`SPILLWAY_XDS_TLS_CERT_FILE`, `SPILLWAY_XDS_TLS_KEY_FILE`).
    pub identity: Option<(PathBuf, PathBuf)>,
    /// The name the server's certificate must hold, when not the URL's host
    /// (`SPILLWAY_XDS_TLS_SERVER_NAME`).
    pub server_name: Option<String>,
}

impl XdsSettings {
    /// The settings, when `SPILLWAY_XDS_SERVER` is set. The files are read now, so a bad
    /// one stops the start naming its setting.
    pub fn from_lookup(lookup: &impl Fn(&str) -> Option<String>) -> Result<Option<Self>, Problem> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let Some(server) = get("SPILLWAY_XDS_SERVER") else {
            return Ok(None);
        };
        let server = if server.starts_with("http://") || server.starts_with("https://") {
            server
        } else {
            format!("http://{server}")
        };
        server
            .parse::<http::Uri>()
            .ok()
            .filter(|u| u.host().is_some())
            .ok_or_else(|| {
                (
                    "SPILLWAY_XDS_SERVER",
                    format!("expected host:port or an http(s):// URL, got {server:?}"),
                )
            })?;
        let file = |name: &'static str| -> Result<Option<PathBuf>, Problem> {
            match get(name) {
                None => Ok(None),
                Some(path) => {
                    std::fs::metadata(&path).map_err(|e| (name, format!("reading {path}: {e}")))?;
                    Ok(Some(path.into()))
                }
            }
        };
        let identity = identity(
            file("SPILLWAY_XDS_TLS_CERT_FILE")?,
            file("SPILLWAY_XDS_TLS_KEY_FILE")?,
        )?;
        let ca = file("SPILLWAY_XDS_TLS_CA_FILE")?;
        if !server.starts_with("https://") && (ca.is_some() || identity.is_some()) {
            return Err((
                "SPILLWAY_XDS_SERVER",
                "TLS files are set, so the server must be an https:// URL".into(),
            ));
        }
        let node_metadata = node_metadata(&get("SPILLWAY_XDS_NODE_METADATA").unwrap_or_default())?;
        Ok(Some(Self {
            server,
            node_id: get("SPILLWAY_XDS_NODE_ID").unwrap_or_else(|| "spillway".into()),
            node_metadata,
            ca,
            identity,
            server_name: get("SPILLWAY_XDS_TLS_SERVER_NAME"),
        }))
    }
}

/// A client certificate and its key: both or neither.
fn identity(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<(PathBuf, PathBuf)>, Problem> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some((cert, key))),
        (None, None) => Ok(None),
        (Some(_), None) => Err((
            "SPILLWAY_XDS_TLS_KEY_FILE",
            "SPILLWAY_XDS_TLS_CERT_FILE is set, so a key is needed too".into(),
        )),
        (None, Some(_)) => Err((
            "SPILLWAY_XDS_TLS_CERT_FILE",
            "SPILLWAY_XDS_TLS_KEY_FILE is set, so a certificate is needed too".into(),
        )),
    }
}

/// `key=value` pairs, comma-separated, for the node's metadata.
fn node_metadata(raw: &str) -> Result<Vec<(String, String)>, Problem> {
    raw.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').ok_or_else(|| {
                (
                    "SPILLWAY_XDS_NODE_METADATA",
                    format!("expected key=value pairs, got {pair:?}"),
                )
            })?;
            Ok((k.trim().to_owned(), v.trim().to_owned()))
        })
        .collect()
}
