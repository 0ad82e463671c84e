//! Sending alert webhooks: one POST of a JSON body, signed with HMAC-SHA256 over the
//! timestamp and the body (`X-Spillway-Signature: t=<seconds>,v1=<hex>`), with the
//! delivery's id (`X-Spillway-Delivery`, and `Idempotency-Key`) so a receiver can drop a
//! repeat. Redirects are not followed: a delivery goes only to the URL an admin configured.
//!
//! Nor does a delivery reach inside the network Spillway runs in, unless an admin allowed
//! it ([`Targets`]): the names it resolves are checked again at each delivery (a name may
//! resolve elsewhere than when the rule was saved).

use std::{net::SocketAddr, sync::Arc, time::Duration};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::{domain::alerts::signed_text, net::outbound::Targets};

/// Resolves webhook hosts, refusing any name that resolves to an internal address the
/// admin has not allowed (a name's addresses are what the connection would use).
struct CheckedResolver(Arc<Targets>);

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let targets = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().trim_end_matches('.').to_ascii_lowercase();
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if !targets.allows_host(&host)
                && let Some(bad) = addrs.iter().find(|a| !targets.allows_ip(a.ip()))
            {
                return Err(format!(
                    "{host} resolves to the internal address {}; an admin can allow it \
                     with SPILLWAY_WEBHOOK_ALLOWED_TARGETS",
                    bad.ip()
                )
                .into());
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The HTTP client that delivers webhooks.
#[derive(Clone)]
pub struct Webhooks {
    client: reqwest::Client,
    targets: Arc<Targets>,
}

impl Default for Webhooks {
    fn default() -> Self {
        Self::new(Targets::default())
    }
}

impl Webhooks {
    pub fn new(targets: Targets) -> Self {
        crate::install_tls_provider();
        let targets = Arc::new(targets);
        let client = reqwest::Client::builder()
            .dns_resolver(Arc::new(CheckedResolver(targets.clone())))
            // Never through a proxy from the environment: the proxy would resolve the
            // name, and the check of the addresses it resolves to would be skipped.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(5))
            .user_agent(concat!("spillway/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("a client without custom TLS settings builds");
        Self { client, targets }
    }

    /// POSTs `body` to `url`; `Ok` with the status when it is 2xx, else what went wrong.
    pub async fn deliver(
        &self,
        url: &str,
        secret: &str,
        id: &str,
        body: &str,
        timestamp_s: i64,
    ) -> Result<u16, String> {
        // An address in the URL itself is not resolved: check it here.
        self.targets
            .check_url(url)
            .map_err(|e| format!("not delivered: the URL {e}"))?;
        let response = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .header("x-spillway-delivery", id)
            .header("idempotency-key", id)
            .header(
                "x-spillway-signature",
                format!(
                    "t={timestamp_s},v1={}",
                    signature(secret, timestamp_s, body)
                ),
            )
            .body(body.to_owned())
            .send()
            .await
            .map_err(|e| format!("not delivered: {e}"))?;
        let status = response.status();
        if status.is_success() {
            Ok(status.as_u16())
        } else if status.is_redirection() {
            Err(format!("{status}: redirects are not followed"))
        } else {
            Err(format!("{status}"))
        }
    }
}

/// The hex HMAC-SHA256 of `<timestamp>.<body>` under `secret`.
pub fn signature(secret: &str, timestamp_s: i64, body: &str) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(signed_text(timestamp_s, body).as_bytes());
    crate::support::ids::to_hex(&mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    /// The unit tests never connect to Redis, which used to be what installed rustls's
    /// provider: the client panicked with "No provider set" (as on a Redis Cluster).
    #[test]
    fn the_client_builds_in_a_process_that_connected_to_nothing() {
        let _ = super::Webhooks::default();
    }

    #[test]
    fn the_signature_is_rfc_4231s_hmac_sha256() {
        // RFC 4231 test case 2 (key "Jefe"): the MAC the signature is made with.
        let mut mac = <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(b"Jefe").unwrap();
        hmac::Mac::update(&mut mac, b"what do ya want for nothing?");
        assert_eq!(
            crate::support::ids::to_hex(&hmac::Mac::finalize(mac).into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            super::signature("Jefe", 12, "{}"),
            super::signature("Jefe", 12, "{}")
        );
        assert_ne!(
            super::signature("Jefe", 12, "{}"),
            super::signature("Jefe", 13, "{}")
        );
    }
}
