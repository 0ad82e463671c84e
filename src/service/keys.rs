//! API keys: random secrets of 256 bits, so a SHA-256 digest is a safe way to keep them.
//! Only digests are held, in memory and in Redis.
//!
//! Two sources: keys from the environment (`SPILLWAY_SERVICE_KEYS`, `SPILLWAY_ADMIN_KEYS`,
//! for bootstrapping and automation; revoked by changing the configuration), and keys
//! created in the dashboard or with `spillway key add` (stored in Redis, revocable). Every
//! instance polls the people generation every 250 ms and reloads the Redis keys when it
//! moved, so a revoked key fails everywhere within about a quarter of a second.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use sha2::{Digest, Sha256};

pub use crate::domain::people::KeyRole;

use crate::{
    store::Store,
    support::clock::now_ms,
    support::ids::{random_bytes, to_hex},
};

/// Who called, by API key: its role and the name the audit log gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyCaller {
    pub role: KeyRole,
    /// `key:<name>` for a stored key, `key:env` for a configured one.
    pub actor: String,
}

#[derive(Clone, Debug)]
struct StoredKey {
    id: String,
    name: String,
    role: KeyRole,
}

/// The API keys this instance accepts.
#[derive(Clone, Debug, Default)]
pub struct ApiKeys {
    service: HashSet<[u8; 32]>,
    admin: HashSet<[u8; 32]>,
    stored: Arc<RwLock<HashMap<[u8; 32], StoredKey>>>,
    /// Key id -> last use (ms), waiting to be written to Redis.
    uses: Arc<Mutex<HashMap<String, i64>>>,
}

impl ApiKeys {
    pub fn new<'a>(
        service: impl IntoIterator<Item = &'a str>,
        admin: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        Self {
            service: service.into_iter().map(digest).collect(),
            admin: admin.into_iter().map(digest).collect(),
            ..Self::default()
        }
    }

    /// The caller of a raw key, if it is a valid one.
    pub fn caller_of(&self, key: &str) -> Option<KeyCaller> {
        if key.is_empty() {
            return None;
        }
        let d = digest(key);
        if self.admin.contains(&d) {
            return Some(KeyCaller {
                role: KeyRole::Admin,
                actor: "key:env".into(),
            });
        }
        if self.service.contains(&d) {
            return Some(KeyCaller {
                role: KeyRole::Service,
                actor: "key:env".into(),
            });
        }
        let stored = self
            .stored
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let k = stored.get(&d)?;
        self.uses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(k.id.clone(), now_ms());
        Some(KeyCaller {
            role: k.role,
            actor: format!("key:{}", k.name),
        })
    }

    /// Loads the stored keys that are not revoked.
    pub(super) async fn reload(&self, store: &Store) -> Result<(), crate::store::StoreError> {
        let keys = store.list_api_keys().await?;
        let map: HashMap<[u8; 32], StoredKey> = keys
            .into_iter()
            .filter(|k| k.revoked_at_ms.is_none())
            .filter_map(|k| {
                let d = from_hex(&k.digest)?;
                Some((
                    d,
                    StoredKey {
                        id: k.id,
                        name: k.name,
                        role: k.role,
                    },
                ))
            })
            .collect();
        *self
            .stored
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = map;
        Ok(())
    }

    /// Keeps the stored keys fresh (polling the people generation every 250 ms) and writes
    /// last-used times every 5 s.
    pub(super) fn spawn_refresher(
        &self,
        store: Store,
        shutdown: &crate::support::shutdown::Shutdown,
    ) {
        let keys = self.clone();
        shutdown.spawn(async move {
            let mut seen: Option<u64> = None;
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            let mut ticks: u32 = 0;
            loop {
                tick.tick().await;
                ticks = ticks.wrapping_add(1);
                if let Ok(generation) = store.people_generation().await
                    && seen != Some(generation)
                {
                    match keys.reload(&store).await {
                        Ok(()) => seen = Some(generation),
                        Err(error) => tracing::warn!(%error, "could not reload API keys"),
                    }
                }
                if ticks.is_multiple_of(20) {
                    let uses: Vec<(String, i64)> = keys
                        .uses
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .drain()
                        .collect();
                    if let Err(error) = store.record_key_use(&uses).await {
                        tracing::debug!(%error, "could not record API key use");
                    }
                }
            }
        });
    }
}

/// SHA-256 of a key.
pub fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn from_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in hex.as_bytes().chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(chunk).ok()?, 16).ok()?;
    }
    Some(out)
}

/// A new random key: 256 bits, hex, with a prefix that says what it is.
pub fn generate_key(prefix: &str) -> String {
    format!("{prefix}_{}", to_hex(&random_bytes::<32>()))
}

/// Splits `secret` into two shares that each say nothing about it: the secret XOR a random
/// pad of its length, and the pad (both hex). One share can sit in Redis and the other in
/// the browser's cookie until the secret is shown once (a new API key): Redis never holds
/// it in the clear.
pub fn split_secret(secret: &str) -> (String, String) {
    let mut pad = vec![0u8; secret.len()];
    getrandom::fill(&mut pad).expect("the OS random generator works");
    let masked: Vec<u8> = secret.bytes().zip(&pad).map(|(s, p)| s ^ p).collect();
    (to_hex(&masked), to_hex(&pad))
}

/// The secret from the two shares of [`split_secret`], if they belong together.
pub fn join_secret(masked_hex: &str, pad_hex: &str) -> Option<String> {
    let bytes = |hex: &str| -> Option<Vec<u8>> {
        if !hex.len().is_multiple_of(2) {
            return None;
        }
        hex.as_bytes()
            .chunks(2)
            .map(|c| u8::from_str_radix(std::str::from_utf8(c).ok()?, 16).ok())
            .collect()
    };
    let (masked, pad) = (bytes(masked_hex)?, bytes(pad_hex)?);
    if masked.len() != pad.len() {
        return None;
    }
    String::from_utf8(masked.iter().zip(&pad).map(|(m, p)| m ^ p).collect()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_recognised_by_role() {
        let keys = ApiKeys::new(["svc"], ["adm"]);
        let role = |k| keys.caller_of(k).map(|c| c.role);
        assert_eq!(role("svc"), Some(KeyRole::Service));
        assert_eq!(role("adm"), Some(KeyRole::Admin));
        assert_eq!(role("nope"), None);
        assert_eq!(role(""), None);
    }

    #[test]
    fn generated_keys_are_long_and_distinct() {
        let (a, b) = (generate_key("spw_svc"), generate_key("spw_svc"));
        assert_ne!(a, b);
        assert_eq!(a.len(), "spw_svc_".len() + 64);
    }

    #[test]
    fn a_split_secret_needs_both_shares() {
        let secret = generate_key("spw_svc");
        let (masked, pad) = split_secret(&secret);
        assert!(!masked.contains(&secret[8..16]) && !pad.contains(&secret[8..16]));
        assert_eq!(join_secret(&masked, &pad).as_deref(), Some(secret.as_str()));
        let (_, other_pad) = split_secret(&secret);
        assert_ne!(
            join_secret(&masked, &other_pad).as_deref(),
            Some(secret.as_str())
        );
        assert_eq!(join_secret(&masked, &pad[2..]), None);
        assert_eq!(join_secret("zz", "00"), None);
    }

    #[test]
    fn hex_round_trips() {
        let d = digest("x");
        assert_eq!(from_hex(&to_hex(&d)), Some(d));
        assert_eq!(from_hex("zz"), None);
    }
}
