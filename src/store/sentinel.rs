//! Redis behind Sentinel: the master the sentinels name, followed through a failover.
//!
//! Every command goes to the current master's connection. A watcher asks the sentinels
//! which master they name every 500 ms (and at once after a command failed); when it is
//! another, a connection to it replaces the old one, so a failover is followed without a
//! restart. While there is no master (the sentinels are still electing one, or none can
//! be reached), commands fail and each policy's failure mode answers, as when Redis is
//! down. Scripts are loaded again on the new master by the usual NOSCRIPT path.

use std::{
    sync::{Arc, RwLock},
    time::Duration,
};

use redis::{
    ConnectionAddr,
    aio::{ConnectionManager, ConnectionManagerConfig},
    sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType},
};
use tokio::sync::{Mutex, Notify};

use super::StoreError;
use crate::config::sentinel::SentinelSettings;

/// How often the sentinels are asked which master they name.
const POLL: Duration = Duration::from_millis(500);

/// The master in use: its address, a client (pub/sub opens its own connection) and the
/// shared connection.
struct Master {
    addr: String,
    client: redis::Client,
    conn: ConnectionManager,
}

/// The link to whichever master the sentinels name.
pub(super) struct SentinelLink {
    current: RwLock<Master>,
    sentinels: Mutex<SentinelClient>,
    settings: ConnectionManagerConfig,
    /// A command failed: look again now rather than at the next tick.
    failed: Notify,
}

impl SentinelLink {
    /// Finds the master through `settings`' sentinels and connects to it; a watcher then
    /// follows failovers for as long as the link lives.
    pub(super) async fn connect(
        settings: &SentinelSettings,
        tls: Option<redis::TlsCertificates>,
        config: ConnectionManagerConfig,
    ) -> Result<Arc<Self>, StoreError> {
        let addrs = settings.sentinels.iter().map(|(host, port)| {
            if settings.tls {
                ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host.clone(), *port)
            }
        });
        let mut builder =
            SentinelClientBuilder::new(addrs, &settings.master, SentinelServerType::Master)?
                .set_client_to_redis_db(settings.db);
        if let Some(user) = &settings.username {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = &settings.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(password) = &settings.sentinel_password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        if settings.tls {
            builder = builder
                .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
            if let Some(tls) = tls {
                let certificates = || redis::TlsCertificates {
                    client_tls: tls.client_tls.as_ref().map(|c| redis::ClientTlsConfig {
                        client_cert: c.client_cert.clone(),
                        client_key: c.client_key.clone(),
                    }),
                    root_cert: tls.root_cert.clone(),
                };
                builder = builder
                    .set_client_to_redis_certificates(certificates())
                    .set_client_to_sentinel_certificates(certificates());
            }
        }
        let mut sentinels = builder.build()?;
        let client = sentinels.async_get_client().await?;
        let master = open(client, &config).await?;
        tracing::info!(master = %master.addr, name = %settings.master, "Redis master found through Sentinel");
        let link = Arc::new(Self {
            current: RwLock::new(master),
            sentinels: Mutex::new(sentinels),
            settings: config,
            failed: Notify::new(),
        });
        tokio::spawn(watch(Arc::downgrade(&link)));
        Ok(link)
    }

    /// The current master's connection (a clone shares it).
    pub(super) fn conn(&self) -> ConnectionManager {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .conn
            .clone()
    }

    /// A client of the current master, for pub/sub.
    pub(super) fn client(&self) -> redis::Client {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .client
            .clone()
    }

    /// A command failed: when the connection is why (a failover may be), the watcher
    /// looks at once; a script's or a command's own error is no news of the master.
    pub(super) fn command_failed(&self, error: &redis::RedisError) {
        if error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_timeout()
            || error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        {
            self.failed.notify_one();
        }
    }

    /// Asks the sentinels which master they name; connects to it when it is another.
    async fn follow(&self) {
        let found = self.sentinels.lock().await.async_get_client().await;
        let client = match found {
            Ok(client) => client,
            Err(error) => {
                tracing::debug!(%error, "no Redis master named by Sentinel just now");
                return;
            }
        };
        let addr = client.get_connection_info().addr().to_string();
        let current = self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .addr
            .clone();
        if addr == current {
            return;
        }
        match open(client, &self.settings).await {
            Ok(master) => {
                tracing::warn!(from = %current, to = %master.addr, "Sentinel named another Redis master: following the failover");
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = master;
            }
            Err(error) => {
                tracing::warn!(%error, master = %addr, "connecting to the new Redis master failed")
            }
        }
    }
}

async fn open(
    client: redis::Client,
    config: &ConnectionManagerConfig,
) -> Result<Master, StoreError> {
    let addr = client.get_connection_info().addr().to_string();
    let conn = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
    Ok(Master { addr, client, conn })
}

/// Follows the sentinels every `POLL`, and at once after a failed command, until the link
/// is dropped.
async fn watch(link: std::sync::Weak<SentinelLink>) {
    while let Some(link) = link.upgrade() {
        link.follow().await;
        // Never faster than this, however many commands fail meanwhile.
        tokio::time::sleep(Duration::from_millis(100)).await;
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = link.failed.notified() => {}
        }
    }
}
