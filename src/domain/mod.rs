//! The pure core: identifiers, rules, policies, decisions, and a reference model of every
//! algorithm. No I/O, no async, no Redis: it compiles to wasm so the dashboard can share it.
//!
//! The model takes time as a parameter and answers as the Lua scripts do (the integration
//! tests drive the same sequences through both). A sliding log of 3 a second, asked at
//! 0 ms, 100 ms, 200 ms and 300 ms, then at 1,001 ms once the first request has left the
//! window:
//!
//! ```
//! use spillway::domain::{Algorithm, step};
//!
//! let rule = Algorithm::SlidingLog { limit: 3, window_ms: 1000 };
//! let mut state = None;
//! let mut answers = Vec::new();
//! for (at_ms, cost) in [(0, 1), (100, 1), (200, 1), (300, 1), (1_001, 1)] {
//!     let (next, outcome) = step(state.as_ref(), at_ms * 1000, cost, &rule, false);
//!     // A denied request consumes nothing: the state stays as it was.
//!     state = next.or(state);
//!     answers.push((outcome.allowed, outcome.remaining, outcome.retry_after_ms));
//! }
//! assert_eq!(
//!     answers,
//!     [
//!         (true, 2, None),
//!         (true, 1, None),
//!         (true, 0, None),
//!         // Full: the oldest request leaves the window at 1,000 ms, 700 ms from now.
//!         (false, 0, Some(700)),
//!         (true, 0, None),
//!     ]
//! );
//! ```

pub mod alerts;
pub mod algorithm;
pub mod backup;
pub mod calendar;
pub mod check;
pub mod envoy;
pub mod envoy_plan;
pub mod history;
pub mod identifier;
pub mod inspection;
pub mod lease;
pub mod local;
pub mod overrides;
pub mod people;
pub mod policy;
pub mod preview;
pub mod rule;
pub mod suggest;
pub mod throttle;
pub mod time;
pub mod whatif;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use algorithm::{Outcome, State, step};
pub use check::{Decision, RuleResult, evaluate};
pub use identifier::Identifier;
pub use policy::{FailureMode, Mode, Policy, RulesFor};
pub use rule::{Algorithm, Rule};

/// The shape of names: 1 to 64 bytes, lowercase letters and digits, and past the first
/// byte the punctuation in `also`.
pub(crate) fn is_slug(raw: &str, also: &[u8]) -> bool {
    let bytes = raw.as_bytes();
    let plain = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    (1..=64).contains(&bytes.len())
        && bytes.first().is_some_and(plain)
        && bytes.iter().all(|b| plain(b) || also.contains(b))
}

/// A policy, rule or dimension name: `[a-z0-9][a-z0-9_-]{0,63}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Name(String);

impl Name {
    /// Parses a name; the error says what is wrong with it.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if !is_slug(raw, b"_-") {
            return Err(format!(
                "must match [a-z0-9][a-z0-9_-]{{0,63}} (lowercase letters, digits, '_' and '-', at most 64), got {raw:?}"
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Name {
    type Error = String;
    fn try_from(raw: String) -> Result<Self, String> {
        Self::parse(&raw)
    }
}

impl From<Name> for String {
    fn from(name: Name) -> String {
        name.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a policy, rule or identifier is not acceptable; always names the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PolicyError {
    pub field: String,
    pub message: String,
}

impl PolicyError {
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// What a query value leaves as it is: the unreserved characters (RFC 3986).
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// What a path given as a query value leaves as it is: the unreserved characters and `/`.
const PATH_IN_QUERY: &percent_encoding::AsciiSet = &UNRESERVED.remove(b'/');

/// Percent-encodes a URL query value (everything but unreserved characters).
pub fn percent_encode(raw: &str) -> String {
    percent_encoding::utf8_percent_encode(raw, UNRESERVED).to_string()
}

/// Percent-encodes a path of this site given as a query value (`/login?next=/people`): its
/// slashes stay readable.
pub fn percent_encode_path(raw: &str) -> String {
    percent_encoding::utf8_percent_encode(raw, PATH_IN_QUERY).to_string()
}

/// The value of `key` in a query string (with or without its `?`), decoded once.
/// leptos_router's query map decodes again what the URL parser decoded: `%25` in a value
/// came out as `%`, and an Envoy descriptor's escapes (`%C2%B7`) as the characters they
/// stand for.
pub fn query_value(search: &str, key: &str) -> Option<String> {
    search.trim_start_matches('?').split('&').find_map(|pair| {
        let (k, value) = pair.split_once('=').unwrap_or((pair, ""));
        (k == key).then(|| {
            let value = value.replace('+', " ");
            percent_encoding::percent_decode_str(&value)
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}
