//! Who is calling: API keys for services and automation. Keys are random secrets of 256
//! bits, so a SHA-256 digest is a safe way to keep them: only digests are held in memory.

use std::collections::HashSet;

use sha2::{Digest, Sha256};

/// What a key may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyRole {
    /// Only the check endpoints.
    Service,
    /// Everything, as an admin.
    Admin,
}

/// The API keys this instance accepts.
#[derive(Clone, Debug, Default)]
pub struct ApiKeys {
    service: HashSet<[u8; 32]>,
    admin: HashSet<[u8; 32]>,
}

impl ApiKeys {
    pub fn new<'a>(
        service: impl IntoIterator<Item = &'a str>,
        admin: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        Self {
            service: service.into_iter().map(digest).collect(),
            admin: admin.into_iter().map(digest).collect(),
        }
    }

    /// The role of the key in an `Authorization: Bearer <key>` header value, if it is one.
    pub fn role_of_bearer(&self, header: Option<&str>) -> Option<KeyRole> {
        let key = header?.strip_prefix("Bearer ")?.trim();
        self.role_of(key)
    }

    /// The role of a raw key, if it is one.
    pub fn role_of(&self, key: &str) -> Option<KeyRole> {
        if key.is_empty() {
            return None;
        }
        let d = digest(key);
        if self.admin.contains(&d) {
            Some(KeyRole::Admin)
        } else if self.service.contains(&d) {
            Some(KeyRole::Service)
        } else {
            None
        }
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// A new random key: 256 bits, URL-safe hex, with a prefix that says what it is.
pub fn generate_key(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the OS random generator works");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}_{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_recognised_by_role() {
        let keys = ApiKeys::new(["svc"], ["adm"]);
        assert_eq!(
            keys.role_of_bearer(Some("Bearer svc")),
            Some(KeyRole::Service)
        );
        assert_eq!(
            keys.role_of_bearer(Some("Bearer adm")),
            Some(KeyRole::Admin)
        );
        assert_eq!(keys.role_of_bearer(Some("Bearer nope")), None);
        assert_eq!(keys.role_of_bearer(Some("svc")), None);
        assert_eq!(keys.role_of_bearer(None), None);
        assert_eq!(keys.role_of(""), None);
    }

    #[test]
    fn generated_keys_are_long_and_distinct() {
        let (a, b) = (generate_key("spw_svc"), generate_key("spw_svc"));
        assert_ne!(a, b);
        assert_eq!(a.len(), "spw_svc_".len() + 64);
    }
}
