//! Identifiers: who a check is about, as a `dimension=value` pair (`ip=203.0.113.7`).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::Name;

/// Longest identifier value, in bytes of UTF-8.
pub const MAX_VALUE_BYTES: usize = 256;

/// The canonical text of `value` when it is an IP address: an IPv4-mapped IPv6 address as
/// the IPv4 one, IPv6 in RFC 5952's form (lower case, the longest run of zeros as `::`);
/// `None` for anything that is not an address.
pub fn canonical_address(value: &str) -> Option<String> {
    match value.parse::<std::net::IpAddr>().ok()? {
        std::net::IpAddr::V4(v4) => Some(v4.to_string()),
        std::net::IpAddr::V6(v6) => Some(match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => v6.to_string(),
        }),
    }
}

/// A dimension (`ip`, `user`) and a value; valid once built.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Identifier {
    dimension: Name,
    value: String,
}

impl Identifier {
    /// Builds an identifier from its parts; the error says what is wrong.
    pub fn new(dimension: &str, value: &str) -> Result<Self, String> {
        let dimension = Name::parse(dimension).map_err(|m| format!("dimension {m}"))?;
        if value.is_empty() {
            return Err(format!("value of {dimension} must not be empty"));
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(format!(
                "value of {dimension} is {} bytes; at most {MAX_VALUE_BYTES} are allowed",
                value.len()
            ));
        }
        if value.chars().any(char::is_control) {
            return Err(format!(
                "value of {dimension} must not contain control characters"
            ));
        }
        // One address, one counter: `::ffff:192.0.2.5` is `192.0.2.5` (and so inside
        // 192.0.2.0/24), and `2001:DB8:0:0::1` is `2001:db8::1` (RFC 5952's text).
        let value = canonical_address(value).unwrap_or_else(|| value.to_owned());
        Ok(Self { dimension, value })
    }

    /// Parses `dimension=value` (the value may itself contain `=`).
    pub fn parse(raw: &str) -> Result<Self, String> {
        let (dimension, value) = raw
            .split_once('=')
            .ok_or_else(|| format!("expected dimension=value, got {raw:?}"))?;
        Self::new(dimension, value)
    }

    pub fn dimension(&self) -> &Name {
        &self.dimension
    }

    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Display for Identifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.dimension, self.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_canonical_before_keys_and_matching() {
        for (given, canonical) in [
            ("::ffff:192.0.2.5", "192.0.2.5"),
            ("2001:DB8:0:0:0:0:0:1", "2001:db8::1"),
            ("2001:db8::0:1", "2001:db8::1"),
            ("2001:0db8:0000:0000:0000:0000:0000:0001", "2001:db8::1"),
            ("192.0.2.5", "192.0.2.5"),
        ] {
            assert_eq!(
                Identifier::new("ip", given).unwrap().value(),
                canonical,
                "{given}"
            );
            // Any dimension whose value is an address.
            assert_eq!(Identifier::new("client", given).unwrap().value(), canonical);
        }
        for other in ["bob", "192.0.2", "010.0.0.1", "[::1]", "2001:db8::1/64"] {
            assert_eq!(Identifier::new("ip", other).unwrap().value(), other);
        }
    }
}
