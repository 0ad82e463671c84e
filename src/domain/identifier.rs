//! Identifiers: who a check is about, as a `dimension=value` pair (`ip=203.0.113.7`).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::Name;

/// Longest identifier value, in bytes of UTF-8.
pub const MAX_VALUE_BYTES: usize = 256;

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
        Ok(Self {
            dimension,
            value: value.to_owned(),
        })
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
