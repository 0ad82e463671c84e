//! envoyproxy/ratelimit's configuration, as a Spillway policy: a domain's file (`key`,
//! optional `value`, `rate_limit`, `shadow_mode`, `replaces`, `detailed_metric`, nested
//! `descriptors`), its tree of limits, a request's descriptors and how they are named as
//! identifiers. Reading a file into the tree is `envoy/parse.rs`, finding a descriptor's limit
//! `envoy/lookup.rs`, the Envoy snippets that wire a domain `envoy/wiring.rs`.

mod lookup;
mod parse;
#[cfg(test)]
mod tests;
mod wiring;

pub use lookup::Found;
pub use wiring::wiring;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{Algorithm, Identifier, Name, PolicyError, Rule, identifier::MAX_VALUE_BYTES};

/// The identifier dimension an Envoy descriptor is counted under: its value is the
/// descriptor's entries, `key=value` joined by ` · ` (`remote_address=10.0.0.1 · path=/api`),
/// each escaped so the entries read back exactly (see [`RequestDescriptor::identifier`]).
pub const DIMENSION: &str = "envoy";
/// `limit_remaining` of an unlimited descriptor, as envoyproxy/ratelimit answers it.
pub const UNLIMITED_REMAINING: u32 = u32::MAX;
/// Most descriptors (tree nodes) one domain may hold, and how deep they may nest.
pub const MAX_NODES: usize = 10_000;
pub const MAX_DEPTH: usize = 16;
/// Longest key, value, name or domain, in bytes.
pub const MAX_TEXT: usize = 256;

/// A rate limit's unit, with envoyproxy/ratelimit's lengths (a month is 30 days, a year 365).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit named `raw`, in any case (`SECOND`, `second`).
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|u| u.as_str().eq_ignore_ascii_case(raw))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The window's length; windows start at multiples of it since the Unix epoch.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// The protocol's number for the unit (`RateLimitResponse.RateLimit.Unit`).
    pub fn code(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    pub fn from_code(code: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|u| u.code() == code)
    }
}

/// A domain's configuration file, as envoyproxy/ratelimit reads it (YAML or JSON). Fields
/// left out are left out when it is written back.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainDoc {
    #[serde(default)]
    pub domain: String,
    /// `descriptors:` with nothing after it (YAML's null) is none, as upstream reads it.
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub descriptors: Vec<DescriptorDoc>,
}

/// A list that may be written as null (`descriptors:` and nothing else): empty.
fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<DescriptorDoc>, D::Error> {
    Ok(Option::<Vec<DescriptorDoc>>::deserialize(d)?.unwrap_or_default())
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescriptorDoc {
    #[serde(default)]
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitDoc>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shadow_mode: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<ReplacesDoc>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub detailed_metric: bool,
    /// Over this limit fails the request only when every quota-mode descriptor of it is over.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quota_mode: bool,
    /// The request's value goes into this descriptor's metric key.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub value_to_metric: bool,
    /// Every value this descriptor's wildcard matches shares one counter.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub share_threshold: bool,
    /// Free-form data, kept with the file and otherwise unused (envoyproxy/ratelimit hands it
    /// to its own extensions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(
        default,
        deserialize_with = "null_as_empty",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub descriptors: Vec<DescriptorDoc>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitDoc {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_unit: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unlimited: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The limits this one replaces when both apply to one request (where
    /// envoyproxy/ratelimit reads it; `replaces` beside `rate_limit` is read too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<ReplacesDoc>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplacesDoc {
    #[serde(default)]
    pub name: String,
}

/// What a limit of the tree allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allowance {
    /// Always allowed; Redis is not asked.
    Unlimited,
    /// `requests_per_unit` per clock-aligned `unit`; 0 always denies. `rule` indexes the
    /// policy's rules (none for 0: nothing is counted).
    Count {
        requests_per_unit: u32,
        unit: Unit,
        rule: Option<usize>,
    },
}

/// A limit of the tree: what it allows and how it behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    /// Its `name` in the file (empty when it has none).
    pub name: String,
    pub allowance: Allowance,
    /// Over the limit is counted and shown, but answered OK.
    pub shadow: bool,
    /// Names of the limits this one replaces when both apply to one request.
    pub replaces: Vec<String>,
    pub detailed_metric: bool,
    /// Over it fails the request only when every quota-mode descriptor of it is over.
    pub quota: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Node {
    limit: Option<usize>,
    /// `share_threshold`: the values its wildcard matches share one counter.
    shares: bool,
    /// `value_to_metric`: a request's value goes into the metric key.
    value_to_metric: bool,
    children: Level,
}

/// One level of the tree, indexed the way matching reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Level {
    /// `key` → `value` → node.
    exact: HashMap<String, HashMap<String, usize>>,
    /// `key` → (value pattern, node) for values with a `*`, in file order.
    wildcards: HashMap<String, Vec<(String, usize)>>,
    /// `key` → node, for descriptors without a value.
    any: HashMap<String, usize>,
}

/// How an Envoy domain counts a request over its limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Counting {
    /// envoyproxy/ratelimit's default: every hit counts, past the limit too, and the answer
    /// says whether the counter is now over it; a descriptor of 0 hits is over once nothing
    /// is left. So a cost reported after the response always lands, and the next request
    /// is denied.
    #[default]
    EveryHit,
    /// All or nothing (envoyproxy/ratelimit's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`): a
    /// request over any of its limits counts nowhere.
    AllOrNothing,
}

impl Counting {
    /// The name a domain's document gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            Counting::EveryHit => "every_hit",
            Counting::AllOrNothing => "all_or_nothing",
        }
    }

    /// The counting named `raw`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        match raw {
            "every_hit" => Ok(Counting::EveryHit),
            "all_or_nothing" => Ok(Counting::AllOrNothing),
            other => Err(format!(
                "{other:?} is not a counting: every_hit (every hit counts, past the limit too) or all_or_nothing (a request over any limit counts nowhere)"
            )),
        }
    }
}

/// A validated domain: its file, its limits and the tree that finds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvoyDomain {
    pub doc: DomainDoc,
    /// How it counts a request over its limit, when the domain says (kept in its policy's
    /// document beside the file, as `counting`); `None`: the server's default.
    pub counting: Option<Counting>,
    /// How it counts now: `counting`, or the server's default (see
    /// `Policy::resolve_envoy_counting`).
    pub counts: Counting,
    /// Every limit in quota mode (the server's `SPILLWAY_ENVOY_QUOTA_MODE`, upstream's
    /// `QUOTA_MODE`; see `Policy::resolve_envoy_quota`): a request is over only when every
    /// descriptor that is not `unlimited` is over, one that found no limit counting as one
    /// within its quota.
    pub quota_all: bool,
    pub limits: Vec<Limit>,
    nodes: Vec<Node>,
    root: Level,
}

impl Serialize for EnvoyDomain {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Some(counting) = self.counting else {
            return self.doc.serialize(s);
        };
        let mut value = serde_json::to_value(&self.doc).map_err(serde::ser::Error::custom)?;
        if let Some(obj) = value.as_object_mut() {
            obj.insert("counting".into(), counting.as_str().into());
        }
        value.serialize(s)
    }
}

/// A descriptor of a request, as the service needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestDescriptor {
    pub entries: Vec<(String, String)>,
}

impl RequestDescriptor {
    /// The identifier this descriptor is counted under: its entries as `key=value` joined
    /// by ` · `, one to one: in keys and values `%`, the separator's `·` and control
    /// characters, and in keys `=`, are written `%XX` (each byte of their UTF-8), so two
    /// distinct descriptors never share a counter however their values are made (a value
    /// `v · method=b` is not two entries). Everything else is written as it is. A text
    /// longer than an identifier may be is cut and ends in ` · #` and a SHA-256 digest of
    /// the whole (64 bits).
    pub fn identifier(&self) -> Identifier {
        let mut text = String::new();
        for (i, (k, v)) in self.entries.iter().enumerate() {
            if i > 0 {
                text.push_str(SEPARATOR);
            }
            escape_into(&mut text, k, true);
            text.push('=');
            escape_into(&mut text, v, false);
        }
        if text.is_empty() {
            text.push('-');
        }
        if text.len() > MAX_VALUE_BYTES {
            // Cut, then a last "entry" `#<digest>`: it holds no `=`, which every entry of an
            // uncut identifier does, so no descriptor's own text can spell a cut one.
            use sha2::Digest;
            let digest = sha2::Sha256::digest(text.as_bytes());
            let mut cut = MAX_VALUE_BYTES - (SEPARATOR.len() + 1 + 16);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str(SEPARATOR);
            text.push('#');
            for b in &digest[..8] {
                text.push_str(&format!("{b:02x}"));
            }
        }
        Identifier::new(DIMENSION, &text).expect("built within an identifier's limits")
    }

    /// The entries of an identifier [`Self::identifier`] made (cut ones read as cut).
    fn entries_of(value: &str) -> Vec<(String, String)> {
        let unescape = |t: &str| {
            percent_encoding::percent_decode_str(t)
                .decode_utf8_lossy()
                .into_owned()
        };
        value
            .split(SEPARATOR)
            .map(|e| {
                let (k, v) = e.split_once('=').unwrap_or((e, ""));
                (unescape(k), unescape(v))
            })
            .collect()
    }
}

/// Between the entries of a descriptor's identifier.
const SEPARATOR: &str = " · ";

/// `text` into `out` as an identifier's key (`is_key`) or value: see
/// [`RequestDescriptor::identifier`].
fn escape_into(out: &mut String, text: &str, is_key: bool) {
    for c in text.chars() {
        if c == '%' || c == '·' || (is_key && c == '=') || c.is_control() {
            let mut utf8 = [0u8; 4];
            for b in c.encode_utf8(&mut utf8).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
}

impl EnvoyDomain {
    /// The rule of this domain that counts `identifier` (an Envoy descriptor's), when its
    /// entries find a counted limit; `None` for other identifiers or no such limit.
    pub fn rule_for(&self, identifier: &Identifier) -> Option<usize> {
        if identifier.dimension().as_str() != DIMENSION {
            return None;
        }
        let entries = RequestDescriptor::entries_of(identifier.value());
        match self.find(&entries)?.allowance {
            Allowance::Count { rule, .. } => rule,
            Allowance::Unlimited => None,
        }
    }
}

/// An identifier as people read it: an Envoy descriptor as its entries
/// (`remote_address=10.0.0.1 · path=/api`), any other as `dimension=value`.
pub fn readable(identifier: &str) -> &str {
    identifier
        .strip_prefix(DIMENSION)
        .and_then(|rest| rest.strip_prefix('='))
        .unwrap_or(identifier)
}

/// Free text as a name's characters: lower case, other characters than `a-z0-9_-` as `-`.
fn name_chars(raw: &str) -> String {
    raw.chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The longest policy name.
const NAME_MAX: usize = 64;

/// The policy name a domain is kept under: lower case, other characters than `a-z0-9_-`
/// as `-`. A domain longer than a name (64 characters; Envoy Gateway's run past it) keeps
/// its first 55 and a hash of the whole, so two long domains that start alike stay two.
pub fn policy_name(domain: &str) -> Result<Name, String> {
    let mut name = name_chars(domain);
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        name.replace_range(..name.chars().next().map_or(0, char::len_utf8), "d");
    }
    if name.len() > NAME_MAX {
        let hash = xxhash_rust::xxh3::xxh3_64(domain.as_bytes());
        // (Before, such a name was cut at 64: `cut_policy_name` still finds it.)
        name.truncate(NAME_MAX - 9);
        name = format!("{name}-{:08x}", hash >> 32);
    }
    Name::parse(&name)
}

/// The name a domain longer than a policy name was kept under before names kept a hash:
/// its first 64 characters (`None` for a domain that fits, whose name never changed).
/// A domain saved then is still found under it.
pub fn cut_policy_name(domain: &str) -> Option<Name> {
    let mut name = name_chars(domain);
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        name.replace_range(..name.chars().next().map_or(0, char::len_utf8), "d");
    }
    if name.len() <= NAME_MAX {
        return None;
    }
    name.truncate(NAME_MAX);
    Name::parse(&name).ok()
}
