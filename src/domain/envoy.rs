//! envoyproxy/ratelimit's configuration, as a Spillway policy: a domain's tree of descriptors
//! (`key`, optional `value`, `rate_limit`, `shadow_mode`, `replaces`, `detailed_metric`,
//! nested `descriptors`), validated with the offending field named; the fixed-window rules
//! its limits are counted under; and how one request descriptor finds its limit in the tree,
//! as envoyproxy/ratelimit matches it (key and value beat a value with `*` wildcards, which
//! beats the key alone; a limit applies only where the descriptor's last entry lands).

use std::collections::{BTreeMap, HashMap};

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

/// The policy name a domain is kept under: lower case, other characters than `a-z0-9_-`
/// as `-`, at most 64 characters. Two domains with one name cannot both be loaded.
pub fn policy_name(domain: &str) -> Result<Name, String> {
    let mut name: String = domain
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        name.replace_range(..name.chars().next().map_or(0, char::len_utf8), "d");
    }
    Name::parse(&name)
}

impl EnvoyDomain {
    /// Reads a domain's file from its JSON form (YAML is turned into JSON first); the error
    /// names the field (`descriptors[0].rate_limit.unit`).
    pub fn from_value(value: &serde_json::Value) -> Result<Self, PolicyError> {
        // `counting` is Spillway's, beside the file's own fields.
        let counting = match value.get("counting") {
            None | Some(serde_json::Value::Null) => None,
            Some(raw) => Some(
                raw.as_str()
                    .ok_or_else(|| "must be a string".to_owned())
                    .and_then(Counting::parse)
                    .map_err(|m| PolicyError::field("counting", m))?,
            ),
        };
        let file = match (value, counting) {
            (serde_json::Value::Object(obj), Some(_)) => {
                let mut obj = obj.clone();
                obj.remove("counting");
                std::borrow::Cow::Owned(serde_json::Value::Object(obj))
            }
            _ => std::borrow::Cow::Borrowed(value),
        };
        let doc: DomainDoc = serde_path_to_error::deserialize(file.as_ref()).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." { "body".to_owned() } else { path };
            PolicyError::field(field, e.inner().to_string())
        })?;
        Ok(Self {
            counting,
            counts: counting.unwrap_or_default(),
            ..Self::from_doc(doc)?
        })
    }

    /// Validates `doc` and builds the tree.
    pub fn from_doc(doc: DomainDoc) -> Result<Self, PolicyError> {
        if doc.domain.is_empty() {
            return Err(PolicyError::field("domain", "is required"));
        }
        text("domain", &doc.domain)?;
        policy_name(&doc.domain).map_err(|m| PolicyError::field("domain", m))?;
        let mut built = EnvoyDomain {
            doc: DomainDoc::default(),
            counting: None,
            counts: Counting::default(),
            limits: Vec::new(),
            nodes: Vec::new(),
            root: Level::default(),
        };
        let mut root = Level::default();
        built.add_level(&doc.descriptors, "descriptors", 1, &mut root)?;
        built.root = root;
        built.doc = doc;
        Ok(built)
    }

    fn add_level(
        &mut self,
        descriptors: &[DescriptorDoc],
        path: &str,
        depth: usize,
        level: &mut Level,
    ) -> Result<(), PolicyError> {
        if depth > MAX_DEPTH {
            return Err(PolicyError::field(
                path,
                format!("descriptors nest at most {MAX_DEPTH} deep"),
            ));
        }
        let mut seen: BTreeMap<(&str, Option<&str>), usize> = BTreeMap::new();
        for (i, d) in descriptors.iter().enumerate() {
            let here = format!("{path}[{i}]");
            check_descriptor(d, &here)?;
            if let Some(first) = seen.insert((d.key.as_str(), d.value.as_deref()), i) {
                return Err(repeated(d, &here, &format!("{path}[{first}]")));
            }
            if self.nodes.len() >= MAX_NODES {
                return Err(PolicyError::field(
                    here,
                    format!("a domain holds at most {MAX_NODES} descriptors"),
                ));
            }
            let limit = match &d.rate_limit {
                None => None,
                Some(rl) => Some(self.add_limit(rl, d, &here)?),
            };
            let index = self.nodes.len();
            self.nodes.push(Node::default());
            let mut children = Level::default();
            self.add_level(
                &d.descriptors,
                &format!("{here}.descriptors"),
                depth + 1,
                &mut children,
            )?;
            self.nodes[index] = Node {
                limit,
                shares: d.share_threshold,
                value_to_metric: d.value_to_metric,
                children,
            };
            match d.value.as_deref() {
                None => {
                    level.any.insert(d.key.clone(), index);
                }
                Some(v) if v.contains('*') => level
                    .wildcards
                    .entry(d.key.clone())
                    .or_default()
                    .push((v.to_owned(), index)),
                Some(v) => {
                    level
                        .exact
                        .entry(d.key.clone())
                        .or_default()
                        .insert(v.to_owned(), index);
                }
            }
        }
        Ok(())
    }

    fn add_limit(
        &mut self,
        rl: &RateLimitDoc,
        d: &DescriptorDoc,
        here: &str,
    ) -> Result<usize, PolicyError> {
        let name = rl.name.clone().unwrap_or_default();
        if !name.is_empty() {
            text(&format!("{here}.rate_limit.name"), &name)?;
        }
        check_replaces(rl, d, here, &name)?;
        let allowance = allowance_of(rl, here)?;
        self.limits.push(Limit {
            name,
            allowance,
            shadow: d.shadow_mode,
            replaces: d
                .replaces
                .iter()
                .chain(&rl.replaces)
                .map(|r| r.name.clone())
                .collect(),
            detailed_metric: d.detailed_metric,
            quota: d.quota_mode,
        });
        Ok(self.limits.len() - 1)
    }

    /// The fixed-window rules the domain's counted limits run as, numbering them into
    /// `limits` (a limit of 0 or unlimited has none). Rule names come from the limit's
    /// `name`, or from the descriptor's path, made unique.
    pub fn rules(&mut self) -> Vec<Rule> {
        let mut paths = vec![String::new(); self.limits.len()];
        fn walk(ds: &[DescriptorDoc], prefix: &str, next: &mut usize, out: &mut [String]) {
            for d in ds {
                let mut here = if prefix.is_empty() {
                    String::new()
                } else {
                    format!("{prefix}-")
                };
                here.push_str(&d.key);
                if let Some(v) = &d.value {
                    here.push('-');
                    here.push_str(v);
                }
                if d.rate_limit.is_some() {
                    out[*next] = here.clone();
                    *next += 1;
                }
                walk(&d.descriptors, &here, next, out);
            }
        }
        // Limits were numbered depth first in file order, as `walk` visits them.
        let mut next = 0;
        walk(&self.doc.descriptors, "", &mut next, &mut paths);
        let mut taken: std::collections::HashSet<String> = Default::default();
        // The next suffix to try for each base name: 10,000 limits of one name took
        // 10,000 tries each (quadratic work on the request thread); now each base
        // carries on where it stopped.
        let mut next_suffix: std::collections::HashMap<String, usize> = Default::default();
        let mut rules = Vec::new();
        for (i, limit) in self.limits.iter_mut().enumerate() {
            let Allowance::Count {
                requests_per_unit,
                unit,
                rule,
            } = &mut limit.allowance
            else {
                continue;
            };
            if *requests_per_unit == 0 {
                continue;
            }
            let base = rule_name(if limit.name.is_empty() {
                &paths[i]
            } else {
                &limit.name
            });
            let mut name = base.clone();
            if !taken.insert(name.clone()) {
                let n = next_suffix.entry(base.clone()).or_insert(2);
                loop {
                    let suffix = format!("-{n}");
                    let mut cut = base.clone();
                    cut.truncate(64 - suffix.len());
                    name = format!("{cut}{suffix}");
                    *n += 1;
                    if taken.insert(name.clone()) {
                        break;
                    }
                }
            }
            *rule = Some(rules.len());
            rules.push(
                Rule::new(
                    rules.len(),
                    &name,
                    Algorithm::FixedWindow {
                        limit: u64::from(*requests_per_unit),
                        window_ms: unit.seconds() * 1000,
                    },
                    Some(vec![DIMENSION.to_owned()]),
                    self.counts == Counting::EveryHit,
                )
                .expect("a valid name and window"),
            );
        }
        rules
    }

    /// The limit a request descriptor finds, if any (none: the descriptor is OK and
    /// consumes nothing).
    pub fn find(&self, entries: &[(String, String)]) -> Option<&Limit> {
        self.lookup(entries).map(|found| found.limit)
    }

    /// The limit a request descriptor finds, with what it is counted and measured under.
    pub fn lookup(&self, entries: &[(String, String)]) -> Option<Found<'_>> {
        let mut level = &self.root;
        let mut shared: Option<Vec<(String, String)>> = None;
        let mut metric = vec![self.doc.domain.clone()];
        for (i, (key, value)) in entries.iter().enumerate() {
            let (n, matched) = level.matching(key, value)?;
            let node = &self.nodes[n];
            if node.shares
                && let Matched::Wildcard(pattern) = matched
            {
                shared.get_or_insert_with(|| entries.to_vec())[i].1 = pattern.to_owned();
            }
            metric.push(metric_segment(key, value, matched, node));
            if i + 1 == entries.len() {
                let limit = &self.limits[node.limit?];
                if limit.detailed_metric {
                    metric = detailed_key(&self.doc.domain, entries, shared.as_deref());
                }
                return Some(Found {
                    limit,
                    shared,
                    metric_key: metric.join("."),
                });
            }
            level = &node.children;
        }
        None
    }
}

/// What a request descriptor finds in a domain: the limit; when an entry matched a wildcard
/// with `share_threshold`, the entries it is counted under (that entry's value is the
/// pattern, so every value it matches shares one counter); and its metric key, as
/// envoyproxy/ratelimit names its statistics (`domain.key_value.key`: configured values,
/// request values only for `value_to_metric` or `detailed_metric`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found<'a> {
    pub limit: &'a Limit,
    pub shared: Option<Vec<(String, String)>>,
    pub metric_key: String,
}

/// How an entry of a request found its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Matched<'a> {
    /// Its key and value, as configured.
    Exact,
    /// A configured wildcard value (the pattern).
    Wildcard(&'a str),
    /// Its key alone (the configuration has no value).
    Key,
}

impl Level {
    /// The node an entry lands on: key and value beat a wildcard, which beats the key
    /// alone.
    fn matching(&self, key: &str, value: &str) -> Option<(usize, Matched<'_>)> {
        if let Some(&n) = self.exact.get(key).and_then(|values| values.get(value)) {
            return Some((n, Matched::Exact));
        }
        if let Some((pattern, n)) = self
            .wildcards
            .get(key)
            .and_then(|ws| ws.iter().find(|(pattern, _)| glob(pattern, value)))
        {
            return Some((*n, Matched::Wildcard(pattern)));
        }
        self.any.get(key).map(|&n| (n, Matched::Key))
    }
}

/// An entry's part of a metric key: `key_value` for a configured value (a shared wildcard's
/// part before its first `*`), the request's value with `value_to_metric`, else `key`.
fn metric_segment(key: &str, value: &str, matched: Matched<'_>, node: &Node) -> String {
    match matched {
        Matched::Exact => format!("{key}_{value}"),
        Matched::Wildcard(pattern) if node.shares => {
            format!("{key}_{}", pattern.split('*').next().unwrap_or_default())
        }
        Matched::Wildcard(_) | Matched::Key if node.value_to_metric => format!("{key}_{value}"),
        Matched::Wildcard(pattern) => format!("{key}_{pattern}"),
        Matched::Key => key.to_owned(),
    }
}

/// The metric key of `detailed_metric`: every entry's key and value as the request sent
/// them (a shared wildcard's part before its `*`).
fn detailed_key(
    domain: &str,
    entries: &[(String, String)],
    shared: Option<&[(String, String)]>,
) -> Vec<String> {
    let mut key = vec![domain.to_owned()];
    for (i, (k, v)) in entries.iter().enumerate() {
        let v = match shared.map(|s| s[i].1.as_str()) {
            Some(pattern) if pattern != v => pattern.split('*').next().unwrap_or_default(),
            _ => v.as_str(),
        };
        key.push(format!("{k}_{v}"));
    }
    key
}

/// Whether `value` matches `pattern`, where each `*` stands for any run of characters
/// (none included): the literal parts must appear in order, the first at the start and the
/// last at the end.
fn glob(pattern: &str, value: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = value.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// A rule name made from free text: lower case, other characters as `-`, at most 64.
fn rule_name(raw: &str) -> String {
    let mut name: String = raw
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        name = format!("d{name}");
        name.truncate(64);
    }
    name
}

fn text(field: &str, value: &str) -> Result<(), PolicyError> {
    if value.len() > MAX_TEXT {
        return Err(PolicyError::field(
            field,
            format!("is {} bytes; at most {MAX_TEXT} are allowed", value.len()),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(PolicyError::field(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// What a descriptor's `rate_limit` (found at `here`) allows: unlimited, or so many a unit
/// (its rule numbered later, by `EnvoyDomain::rules`).
fn allowance_of(rl: &RateLimitDoc, here: &str) -> Result<Allowance, PolicyError> {
    Ok(if rl.unlimited {
        if rl.unit.is_some() {
            return Err(PolicyError::field(
                format!("{here}.rate_limit.unit"),
                "must be left out when unlimited is true",
            ));
        }
        if rl.requests_per_unit.is_some() {
            return Err(PolicyError::field(
                format!("{here}.rate_limit.requests_per_unit"),
                "must be left out when unlimited is true",
            ));
        }
        Allowance::Unlimited
    } else {
        let unit = match rl.unit.as_deref() {
            None => {
                return Err(PolicyError::field(
                    format!("{here}.rate_limit.unit"),
                    "is required (second, minute, hour, day, week, month or year)",
                ));
            }
            Some(raw) => Unit::parse(raw).ok_or_else(|| {
                PolicyError::field(
                    format!("{here}.rate_limit.unit"),
                    format!(
                        "{raw:?} is not a unit: second, minute, hour, day, week, month or year"
                    ),
                )
            })?,
        };
        let requests_per_unit = rl.requests_per_unit.unwrap_or(0);
        if u64::from(requests_per_unit) > super::rule::MAX_AMOUNT {
            return Err(PolicyError::field(
                format!("{here}.rate_limit.requests_per_unit"),
                format!("at most {}", super::rule::MAX_AMOUNT),
            ));
        }
        Allowance::Count {
            requests_per_unit,
            unit,
            rule: None,
        }
    })
}

/// The names a limit `replaces` (beside its `rate_limit` or inside it, as upstream writes
/// it): each given, and none its own `name`.
fn check_replaces(
    rl: &RateLimitDoc,
    d: &DescriptorDoc,
    here: &str,
    name: &str,
) -> Result<(), PolicyError> {
    let beside = d
        .replaces
        .iter()
        .enumerate()
        .map(|(j, r)| (format!("{here}.replaces[{j}].name"), r));
    let inside = rl
        .replaces
        .iter()
        .enumerate()
        .map(|(j, r)| (format!("{here}.rate_limit.replaces[{j}].name"), r));
    for (field, r) in beside.chain(inside) {
        if r.name.is_empty() {
            return Err(PolicyError::field(field, "is required"));
        }
        if r.name == name {
            return Err(PolicyError::field(
                field,
                "names this descriptor's own limit; a limit cannot replace itself",
            ));
        }
    }
    Ok(())
}

/// A descriptor's own fields, found at `here`: a key, texts within their length, and
/// `replaces` only beside a `rate_limit`.
fn check_descriptor(d: &DescriptorDoc, here: &str) -> Result<(), PolicyError> {
    if d.key.is_empty() {
        return Err(PolicyError::field(format!("{here}.key"), "is required"));
    }
    text(&format!("{here}.key"), &d.key)?;
    if let Some(v) = &d.value {
        text(&format!("{here}.value"), v)?;
    }
    if d.rate_limit.is_none() && !d.replaces.is_empty() {
        return Err(PolicyError::field(
            format!("{here}.replaces"),
            "needs a rate_limit on the same descriptor",
        ));
    }
    if d.share_threshold && !d.value.as_deref().is_some_and(|v| v.contains('*')) {
        return Err(PolicyError::field(
            format!("{here}.share_threshold"),
            "needs a wildcard value (containing *): the values it matches share one counter",
        ));
    }
    Ok(())
}

/// The error for descriptor `d` at `here`, whose key and value the one at `first` has.
fn repeated(d: &DescriptorDoc, here: &str, first: &str) -> PolicyError {
    PolicyError::field(
        here,
        format!(
            "duplicates {first}: key {:?}{} appears twice at one level",
            d.key,
            d.value
                .as_deref()
                .map(|v| format!(" with value {v:?}"))
                .unwrap_or_default()
        ),
    )
}

/// What to add to Envoy's configuration so it asks Spillway about `doc`'s domain, as
/// (where it goes, YAML): the rate limit filter, a route's `rate_limits` with one action per
/// top-level descriptor key, and the cluster for a gRPC port `grpc_port` (`None`: Envoy's
/// protocol is off on this server). Each part is a YAML document of its own.
pub fn wiring(
    doc: &DomainDoc,
    grpc_port: Option<u16>,
    key_required: bool,
) -> Vec<(String, String)> {
    let key = if key_required {
        "\n      initial_metadata:\n        - {key: authorization, value: \"Bearer spw_svc_...\"}  # a service key"
    } else {
        ""
    };
    let mut keys: Vec<&str> = Vec::new();
    for d in &doc.descriptors {
        if !keys.contains(&d.key.as_str()) {
            keys.push(&d.key);
        }
    }
    let actions: String = keys
        .iter()
        .map(|k| match *k {
            "remote_address" => "      - remote_address: {}\n".to_owned(),
            k => format!("      - request_headers: {{header_name: x-{k}, descriptor_key: {k}}}\n"),
        })
        .collect();
    let filter = format!(
        "- name: envoy.filters.http.ratelimit\n  typed_config:\n    \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit\n    domain: {:?}\n    failure_mode_deny: false\n    timeout: 0.1s  # the filter's own default is 20 ms\n    rate_limit_service:\n      transport_api_version: V3\n      grpc_service:\n        envoy_grpc: {{cluster_name: spillway}}{}\n",
        doc.domain,
        key.replace("\n      ", "\n        ")
    );
    let route = format!("rate_limits:\n  - actions:\n{actions}");
    let port = grpc_port.unwrap_or(8081);
    let off = if grpc_port.is_none() {
        "# Envoy's protocol is off on this server: set SPILLWAY_GRPC_ADDR\n"
    } else {
        ""
    };
    let cluster = format!(
        "{off}- name: spillway\n  type: STRICT_DNS\n  typed_extension_protocol_options:\n    envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n      \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n      explicit_http_config: {{http2_protocol_options: {{}}}}\n  load_assignment:\n    cluster_name: spillway\n    endpoints:\n      - lb_endpoints:\n          - endpoint: {{address: {{socket_address: {{address: spillway, port_value: {port}}}}}}}\n"
    );
    vec![
        (
            "The HTTP connection manager's http_filters, before the router".to_owned(),
            filter,
        ),
        (
            "The route or virtual host: what each request is counted by".to_owned(),
            route,
        ),
        (
            "The clusters: Spillway's gRPC port (HTTP/2)".to_owned(),
            cluster,
        ),
    ]
}

#[cfg(test)]
mod wiring_tests {
    use super::*;

    #[test]
    fn each_part_of_the_wiring_is_yaml_envoy_reads() {
        let doc: DomainDoc = serde_yaml::from_str(
            "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
        )
        .unwrap();
        let parts = wiring(&doc, Some(9091), true);
        let filter: serde_yaml::Value = serde_yaml::from_str(&parts[0].1).unwrap();
        assert_eq!(filter[0]["typed_config"]["domain"], "edge");
        assert_eq!(
            filter[0]["typed_config"]["rate_limit_service"]["grpc_service"]["initial_metadata"][0]
                ["key"],
            "authorization"
        );
        let route: serde_yaml::Value = serde_yaml::from_str(&parts[1].1).unwrap();
        let actions = &route["rate_limits"][0]["actions"];
        assert!(actions[0]["remote_address"].is_mapping());
        assert_eq!(actions[1]["request_headers"]["descriptor_key"], "user");
        let cluster: serde_yaml::Value = serde_yaml::from_str(&parts[2].1).unwrap();
        assert_eq!(
            cluster[0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
                ["socket_address"]["port_value"],
            9091
        );
        let without_key = wiring(&doc, None, false);
        assert!(!without_key[0].1.contains("initial_metadata"));
        assert!(without_key[2].1.contains("SPILLWAY_GRPC_ADDR"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn domain(v: serde_json::Value) -> Result<EnvoyDomain, PolicyError> {
        EnvoyDomain::from_value(&v)
    }

    fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn found(d: &EnvoyDomain, pairs: &[(&str, &str)]) -> Option<String> {
        d.find(&entries(pairs)).map(|l| l.name.clone())
    }

    #[test]
    fn key_and_value_beat_a_prefix_which_beats_the_key_alone() {
        let d = domain(json!({"domain": "d", "descriptors": [
            {"key": "path", "rate_limit": {"unit": "second", "requests_per_unit": 1, "name": "any"}},
            {"key": "path", "value": "/api*", "rate_limit": {"unit": "second", "requests_per_unit": 2, "name": "prefix"}},
            {"key": "path", "value": "/api/login", "rate_limit": {"unit": "second", "requests_per_unit": 3, "name": "exact"}},
        ]}))
        .unwrap();
        assert_eq!(
            found(&d, &[("path", "/api/login")]).as_deref(),
            Some("exact")
        );
        assert_eq!(
            found(&d, &[("path", "/api/users")]).as_deref(),
            Some("prefix")
        );
        assert_eq!(found(&d, &[("path", "/other")]).as_deref(), Some("any"));
        assert_eq!(found(&d, &[("host", "x")]), None);
    }

    #[test]
    fn a_limit_applies_only_where_the_last_entry_lands() {
        let d = domain(json!({"domain": "d", "descriptors": [
            {"key": "remote_address", "descriptors": [
                {"key": "path", "value": "/a", "rate_limit": {"unit": "minute", "requests_per_unit": 5, "name": "nested"}},
            ]},
            {"key": "user", "rate_limit": {"unit": "hour", "requests_per_unit": 5, "name": "top"}, "descriptors": [
                {"key": "plan", "value": "free"},
            ]},
        ]}))
        .unwrap();
        assert_eq!(
            found(&d, &[("remote_address", "1.2.3.4"), ("path", "/a")]).as_deref(),
            Some("nested")
        );
        // Stopping halfway finds nothing; so does going past a leaf or a node without a limit.
        assert_eq!(found(&d, &[("remote_address", "1.2.3.4")]), None);
        assert_eq!(found(&d, &[("remote_address", "1"), ("path", "/b")]), None);
        assert_eq!(found(&d, &[("user", "u"), ("plan", "free")]), None);
        assert_eq!(found(&d, &[("user", "u")]).as_deref(), Some("top"));
        assert_eq!(found(&d, &[]), None);
    }

    #[test]
    fn invalid_files_name_their_field() {
        let cases = [
            (json!({"descriptors": []}), "domain"),
            (
                json!({"domain": "d", "descriptors": [{"value": "x"}]}),
                "descriptors[0].key",
            ),
            (
                json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"unit": "fortnight", "requests_per_unit": 1}}]}),
                "descriptors[0].rate_limit.unit",
            ),
            (
                json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"requests_per_unit": 1}}]}),
                "descriptors[0].rate_limit.unit",
            ),
            (
                json!({"domain": "d", "descriptors": [{"key": "k", "value": "v"}, {"key": "k", "value": "v"}]}),
                "descriptors[1]",
            ),
            (
                json!({"domain": "d", "descriptors": [{"key": "k", "descriptors": [{"key": "a"}, {"key": "a"}]}]}),
                "descriptors[0].descriptors[1]",
            ),
            (
                json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"unlimited": true, "unit": "second"}}]}),
                "descriptors[0].rate_limit.unit",
            ),
            (
                json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"unlimited": true, "requests_per_unit": 5}}]}),
                "descriptors[0].rate_limit.requests_per_unit",
            ),
            (
                json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 1, "name": "a"}, "replaces": [{}]}]}),
                "descriptors[0].replaces[0].name",
            ),
            (
                json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": 1, "name": "a"}, "replaces": [{"name": "a"}]}]}),
                "descriptors[0].replaces[0].name",
            ),
            (
                json!({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"unit": "second", "requests_per_unit": -1}}]}),
                "descriptors[0].rate_limit.requests_per_unit",
            ),
            (
                json!({"domain": "d", "descriptors": [{"key": "k", "ratelimit": {}}]}),
                "descriptors[0].ratelimit",
            ),
        ];
        for (doc, field) in cases {
            let e = domain(doc.clone()).expect_err(&doc.to_string());
            assert_eq!(e.field, field, "{doc}: {}", e.message);
            assert!(!e.message.is_empty());
        }
    }

    proptest::proptest! {
        /// Every count the file format can hold, in every unit: accepted and made a rule up
        /// to 10^9, refused naming the field above, never a panic.
        #[test]
        fn every_count_and_unit_is_a_rule_or_a_named_refusal(
            rpu in proptest::prop_oneof![
                proptest::strategy::Just(0u32),
                proptest::strategy::Just(1u32),
                proptest::strategy::Just(1_000_000_000u32),
                proptest::strategy::Just(1_000_000_001u32),
                proptest::strategy::Just(u32::MAX),
                proptest::prelude::any::<u32>(),
            ],
            unit in proptest::sample::select(Unit::ALL.to_vec()),
        ) {
            let doc = json!({"domain": "d", "descriptors": [
                {"key": "k", "rate_limit": {"unit": unit.as_str(), "requests_per_unit": rpu}}]});
            match domain(doc) {
                Ok(mut d) => {
                    proptest::prop_assert!(u64::from(rpu) <= super::super::rule::MAX_AMOUNT);
                    let rules = d.rules();
                    proptest::prop_assert_eq!(rules.len(), usize::from(rpu > 0));
                    if rpu > 0 {
                        proptest::prop_assert_eq!(rules[0].algorithm, Algorithm::FixedWindow {
                            limit: u64::from(rpu),
                            window_ms: unit.seconds() * 1000,
                        });
                    }
                }
                Err(e) => {
                    proptest::prop_assert!(u64::from(rpu) > super::super::rule::MAX_AMOUNT);
                    proptest::prop_assert_eq!(e.field, "descriptors[0].rate_limit.requests_per_unit");
                }
            }
        }
    }

    /// N4 of the second probe: 10,000 limits of one name took 10,000 tries each to name
    /// (4 s of a request thread). Each still gets its own name, in order.
    #[test]
    fn many_limits_of_one_name_get_distinct_names() {
        let descriptors: Vec<_> = (0..MAX_NODES)
            .map(|i| json!({"key": format!("k{i}"), "rate_limit": {"unit": "second", "requests_per_unit": 1, "name": "same"}}))
            .collect();
        let mut d = domain(json!({"domain": "d", "descriptors": descriptors})).unwrap();
        let rules = d.rules();
        assert_eq!(rules.len(), MAX_NODES);
        assert_eq!(rules[0].name.as_str(), "same");
        assert_eq!(rules[1].name.as_str(), "same-2");
        assert_eq!(
            rules[MAX_NODES - 1].name.as_str(),
            format!("same-{MAX_NODES}")
        );
        let names: std::collections::HashSet<&str> =
            rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names.len(), MAX_NODES);
    }

    #[test]
    fn counted_limits_become_fixed_window_rules_with_unique_names() {
        let mut d = domain(json!({"domain": "d", "descriptors": [
            {"key": "a", "rate_limit": {"unit": "MINUTE", "requests_per_unit": 10, "name": "Same Name"}},
            {"key": "b", "rate_limit": {"unit": "day", "requests_per_unit": 3, "name": "same name"}},
            {"key": "c", "rate_limit": {"unlimited": true}},
            {"key": "z", "rate_limit": {"unit": "second", "requests_per_unit": 0}},
            {"key": "e", "value": "/x*", "rate_limit": {"unit": "year", "requests_per_unit": 1}},
        ]}))
        .unwrap();
        let rules = d.rules();
        let names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["same-name", "same-name-2", "e--x-"]);
        assert_eq!(
            rules[1].algorithm,
            Algorithm::FixedWindow {
                limit: 3,
                window_ms: 86_400_000
            }
        );
        assert_eq!(
            d.limits[3].allowance,
            Allowance::Count {
                requests_per_unit: 0,
                unit: Unit::Second,
                rule: None
            }
        );
        assert!(matches!(
            d.limits[4].allowance,
            Allowance::Count { rule: Some(2), .. }
        ));
    }

    #[test]
    fn long_or_odd_descriptors_still_make_distinct_valid_identifiers() {
        let long = |tail: &str| RequestDescriptor {
            entries: vec![("path".into(), format!("{}{tail}", "x".repeat(400)))],
        };
        let (a, b) = (long("a").identifier(), long("b").identifier());
        assert_ne!(a, b);
        assert!(a.value().len() <= MAX_VALUE_BYTES);
        let odd = RequestDescriptor {
            entries: vec![("k".into(), "a\nb".into()), ("é".into(), "ü".repeat(200))],
        };
        assert!(odd.identifier().value().starts_with("k=a%0Ab · é="));
        assert_eq!(
            RequestDescriptor {
                entries: vec![
                    ("remote_address".into(), "10.0.0.1".into()),
                    ("path".into(), "/api".into())
                ]
            }
            .identifier()
            .to_string(),
            "envoy=remote_address=10.0.0.1 · path=/api"
        );
    }

    /// The collision a probe found: a value holding the separator made two descriptors
    /// one counter.
    #[test]
    fn a_value_holding_the_separator_is_not_two_entries() {
        let victim = RequestDescriptor {
            entries: vec![
                ("user".into(), "v".into()),
                ("method".into(), "b · method=c".into()),
            ],
        };
        let attacker = RequestDescriptor {
            entries: vec![
                ("user".into(), "v · method=b".into()),
                ("method".into(), "c".into()),
            ],
        };
        assert_ne!(victim.identifier(), attacker.identifier());
        assert_eq!(
            victim.identifier().value(),
            "user=v · method=b %C2%B7 method=c"
        );
        // A cut identifier against a short descriptor that spells it out (a reviewer's
        // pair: the cut one used to end in ` #<digest>`, which a value could hold).
        let long = RequestDescriptor {
            entries: vec![("path".into(), format!("/{}", "a".repeat(300)))],
        };
        let cut = long.identifier();
        let spelled = RequestDescriptor {
            entries: vec![(
                "path".into(),
                cut.value().strip_prefix("path=").unwrap().to_owned(),
            )],
        };
        assert_ne!(spelled.identifier(), cut);
        assert!(cut.value().len() <= MAX_VALUE_BYTES);
        // A key's `=`, a `%`, and a control character against what it once became.
        for (a, b) in [
            (("a=b", "c"), ("a", "b=c")),
            (("k", "50%25"), ("k", "50%")),
            (("k", "a\tb"), ("k", "a?b")),
        ] {
            let one = |(k, v): (&str, &str)| {
                RequestDescriptor {
                    entries: vec![(k.into(), v.into())],
                }
                .identifier()
            };
            assert_ne!(one(a), one(b), "{a:?} / {b:?}");
        }
    }

    proptest::proptest! {
        /// Every descriptor that fits an identifier reads back from it exactly, so no two
        /// share one; longer ones still get distinct valid identifiers. The characters are
        /// those that matter to the encoding, with plain ones between them.
        #[test]
        fn a_descriptor_reads_back_from_its_identifier(
            entries in proptest::collection::vec(
                ("[a= %·\t\x00é:]{0,12}", "[a= %·\t\x00é:]{0,40}"),
                1..6,
            ),
            other in proptest::collection::vec(
                ("[a= %·\t\x00é:]{0,12}", "[a= %·\t\x00é:]{0,300}"),
                1..6,
            ),
        ) {
            let id = RequestDescriptor { entries: entries.clone() }.identifier();
            proptest::prop_assert!(id.value().len() <= MAX_VALUE_BYTES);
            if id.value().len() < MAX_VALUE_BYTES - 20 {
                proptest::prop_assert_eq!(RequestDescriptor::entries_of(id.value()), entries.clone());
            }
            let id2 = RequestDescriptor { entries: other.clone() }.identifier();
            proptest::prop_assert!(id2.value().len() <= MAX_VALUE_BYTES);
            if other != entries {
                proptest::prop_assert_ne!(id, id2);
            }
        }
    }

    #[test]
    fn a_star_stands_for_any_run_of_characters_anywhere() {
        for (pattern, value, matches) in [
            ("/api/*", "/api/users", true),
            ("/api/*", "/api/", true),
            ("/api/*", "/ap", false),
            ("bar*b", "barab", true),
            ("bar*b", "bar123b", true),
            ("bar*b", "barb", true),
            ("bar*b", "bara", false),
            ("bar*b", "xbarb", false),
            ("foo*bar*baz", "foobarbaz", true),
            ("foo*bar*baz", "foo1bar2baz", true),
            ("foo*bar*baz", "foo123baz", false),
            ("*", "", true),
            ("a*a", "a", false),
        ] {
            assert_eq!(glob(pattern, value), matches, "{pattern} ~ {value}");
        }
    }

    #[test]
    fn descriptors_read_as_their_entries() {
        assert_eq!(
            readable("envoy=remote_address=10.0.0.1 · path=/api"),
            "remote_address=10.0.0.1 · path=/api"
        );
        assert_eq!(readable("user=42"), "user=42");
        assert_eq!(readable("envoyx=1"), "envoyx=1");
    }

    #[test]
    fn domains_map_to_policy_names() {
        assert_eq!(policy_name("edge_proxy").unwrap().as_str(), "edge_proxy");
        assert_eq!(
            policy_name("Istio.Example").unwrap().as_str(),
            "istio-example"
        );
        assert_eq!(policy_name("_x").unwrap().as_str(), "dx");
    }

    #[test]
    fn upstreams_fields_are_read_with_their_meaning() {
        // `replaces` where envoyproxy/ratelimit writes it, inside `rate_limit`.
        let d = domain(json!({"domain": "d", "descriptors": [
            {"key": "a", "rate_limit": {"unit": "second", "requests_per_unit": 1, "name": "a"}},
            {"key": "b", "rate_limit": {"unit": "second", "requests_per_unit": 1, "name": "b",
                "replaces": [{"name": "a"}]}, "quota_mode": true, "metadata": {"team": ["x"]}},
        ]}))
        .unwrap();
        let b = d.find(&entries(&[("b", "v")])).unwrap();
        assert_eq!((b.replaces.clone(), b.quota), (vec!["a".to_owned()], true));
        // Refused as upstream refuses them, the field named.
        let refused = |v: serde_json::Value| domain(v).unwrap_err().field;
        assert_eq!(
            refused(json!({"domain": "d", "descriptors": [
                {"key": "a", "rate_limit": {"unit": "second", "requests_per_unit": 1, "name": "a",
                    "replaces": [{"name": "a"}]}}]})),
            "descriptors[0].rate_limit.replaces[0].name"
        );
        assert_eq!(
            refused(json!({"domain": "d", "descriptors": [
                {"key": "a", "value": "exact", "share_threshold": true,
                    "rate_limit": {"unit": "second", "requests_per_unit": 1}}]})),
            "descriptors[0].share_threshold"
        );
        assert_eq!(
            refused(json!({"domain": "d", "descriptors": [{"key": "a", "metadata": 5}]})),
            "descriptors[0].metadata"
        );
        // A domain with no descriptors loads, `descriptors:` left empty too: every request
        // is OK.
        let empty = domain(json!({"domain": "d", "descriptors": []})).unwrap();
        assert_eq!(empty.find(&entries(&[("a", "b")])), None);
        assert_eq!(
            domain(json!({"domain": "d", "descriptors": null})).unwrap(),
            empty
        );
    }

    #[test]
    fn metric_keys_are_named_as_upstream_names_its_statistics() {
        let d = domain(json!({"domain": "d", "descriptors": [
            {"key": "k", "value": "v", "rate_limit": {"unit": "second", "requests_per_unit": 1}},
            {"key": "any", "rate_limit": {"unit": "second", "requests_per_unit": 1}},
            {"key": "vtm", "value_to_metric": true, "rate_limit": {"unit": "second", "requests_per_unit": 1}},
            {"key": "w", "value": "p*", "rate_limit": {"unit": "second", "requests_per_unit": 1}},
            {"key": "s", "value": "p*", "share_threshold": true, "rate_limit": {"unit": "second", "requests_per_unit": 1}},
            {"key": "det", "detailed_metric": true, "rate_limit": {"unit": "second", "requests_per_unit": 1}},
            {"key": "outer", "descriptors": [
                {"key": "inner", "rate_limit": {"unit": "second", "requests_per_unit": 1}}]},
        ]}))
        .unwrap();
        let key = |pairs: &[(&str, &str)]| d.lookup(&entries(pairs)).unwrap().metric_key;
        assert_eq!(key(&[("k", "v")]), "d.k_v");
        assert_eq!(key(&[("any", "x")]), "d.any");
        assert_eq!(key(&[("vtm", "x")]), "d.vtm_x");
        assert_eq!(key(&[("w", "pq")]), "d.w_p*");
        assert_eq!(key(&[("s", "pq")]), "d.s_p");
        assert_eq!(key(&[("det", "x")]), "d.det_x");
        assert_eq!(key(&[("outer", "o"), ("inner", "i")]), "d.outer.inner");
        let shared = d.lookup(&entries(&[("s", "pq")])).unwrap().shared;
        assert_eq!(shared, Some(vec![("s".to_owned(), "p*".to_owned())]));
    }

    #[test]
    fn a_domains_counting_is_kept_beside_its_file() {
        let d = domain(json!({"domain": "d", "counting": "all_or_nothing", "descriptors": []}))
            .unwrap();
        assert_eq!(
            (d.counting, d.counts),
            (Some(Counting::AllOrNothing), Counting::AllOrNothing)
        );
        let written = serde_json::to_value(&d).unwrap();
        assert_eq!(written["counting"], "all_or_nothing");
        assert_eq!(domain(written).unwrap(), d);
        assert_eq!(
            domain(json!({"domain": "d", "counting": "sometimes"}))
                .unwrap_err()
                .field,
            "counting"
        );
        let plain = domain(json!({"domain": "d"})).unwrap();
        assert_eq!((plain.counting, plain.counts), (None, Counting::EveryHit));
        assert!(
            serde_json::to_value(&plain)
                .unwrap()
                .get("counting")
                .is_none()
        );
    }
}
