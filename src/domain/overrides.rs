//! Overrides: for identifiers matching an exact value, a `*` wildcard or an IP CIDR, other
//! rules (or `unlimited`, or `block`) on a policy, optionally until an expiry time.
//! Exact beats wildcard beats CIDR beats the policy's own rules.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Serialize, Serializer, ser::SerializeMap};
use serde_json::Value;

use super::{
    Identifier, Name, PolicyError, Rule, identifier::MAX_VALUE_BYTES, policy::parse_rules,
};

/// Most overrides one policy may have.
pub const MAX_OVERRIDES: usize = 1000;

/// Which identifier values an override matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    Exact(String),
    /// `*` matches any run of characters.
    Wildcard(String),
    Cidr(IpNet),
}

impl Pattern {
    fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() {
            return Err("the value to match must not be empty".into());
        }
        if raw.contains('*') {
            return Ok(Pattern::Wildcard(raw.to_owned()));
        }
        if raw.contains('/')
            && let Ok(net) = raw.parse::<IpNet>()
        {
            return Ok(Pattern::Cidr(net.trunc()));
        }
        // Matched against identifiers, whose addresses are canonical.
        Ok(Pattern::Exact(
            super::identifier::canonical_address(raw).unwrap_or_else(|| raw.to_owned()),
        ))
    }

    fn as_string(&self) -> String {
        match self {
            Pattern::Exact(s) | Pattern::Wildcard(s) => s.clone(),
            Pattern::Cidr(net) => net.to_string(),
        }
    }

    fn matches(&self, value: &str) -> bool {
        match self {
            Pattern::Exact(s) => s == value,
            Pattern::Wildcard(p) => glob(p.as_bytes(), value.as_bytes()),
            Pattern::Cidr(net) => value.parse::<IpAddr>().is_ok_and(|ip| net.contains(&ip)),
        }
    }

    /// Higher wins: exact, then wildcard (longer pattern first), then CIDR (longer prefix).
    fn precedence(&self) -> (u8, usize) {
        match self {
            Pattern::Exact(_) => (3, 0),
            Pattern::Wildcard(p) => (2, p.len()),
            Pattern::Cidr(net) => (1, net.prefix_len() as usize),
        }
    }
}

/// `*`-only glob, iterative with backtracking to the last star.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|b| *b == b'*')
}

/// What an override does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Unlimited,
    Block,
    /// Other rules instead of the policy's.
    Rules(Vec<Rule>),
}

/// One override of a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    pub dimension: Name,
    pub pattern: Pattern,
    pub action: Action,
    /// Milliseconds since the epoch after which the override no longer applies.
    pub expires_at_ms: Option<i64>,
    pub reason: String,
}

impl Override {
    /// Whether this override lifts or changes the limit for more than a handful of
    /// identifiers: any wildcard (`user=*`, but also `ip=*.*`, `envoy=*=*`, or `0*` … `9*`
    /// together), or an address block wider than an IPv4 /16 or an IPv6 /48 (two /1 blocks
    /// cover every address). Such an override can turn the policy off for everyone, which
    /// is a policy change, an admin's to make; support lifts limits for named identifiers
    /// and networks, and may block any pattern.
    pub fn loosens_broadly(&self) -> bool {
        let broad = match &self.pattern {
            Pattern::Wildcard(_) => true,
            Pattern::Cidr(IpNet::V4(net)) => net.prefix_len() < 16,
            // An IPv6 network that holds IPv4 addresses written as IPv6 (::ffff:0:0/96,
            // ::/96, 64:ff9b::/96) is as wide as the IPv4 network it covers.
            Pattern::Cidr(IpNet::V6(net)) => {
                let carries_v4 = ["::ffff:0:0", "::", "64:ff9b::"].iter().any(|base| {
                    net.contains(&base.parse::<std::net::Ipv6Addr>().expect("an address"))
                });
                net.prefix_len() < if carries_v4 { 112 } else { 48 }
            }
            Pattern::Exact(_) => false,
        };
        broad && !matches!(self.action, Action::Block)
    }

    /// Parses `{"match": "user=vip-*", "action": "unlimited"|"block"|"limit", "rules": [...],
    /// "expires_at_ms": 1767225600000, "reason": "..."}` found at `path`.
    pub fn from_document(value: &Value, path: &str) -> Result<Self, PolicyError> {
        let at = |f: &str| format!("{path}.{f}");
        let obj = value
            .as_object()
            .ok_or_else(|| PolicyError::field(path, "must be an object"))?;
        if let Some(k) = obj.keys().find(|k| {
            !["match", "action", "rules", "expires_at_ms", "reason"].contains(&k.as_str())
        }) {
            return Err(PolicyError::field(
                at(k),
                "is not a known field (expected match, action, rules, expires_at_ms, reason)",
            ));
        }
        let raw = obj.get("match").and_then(Value::as_str).ok_or_else(|| {
            PolicyError::field(
                at("match"),
                "is required: dimension=value, dimension=prefix-*, or ip=10.0.0.0/8",
            )
        })?;
        let (dimension, pattern) = raw.split_once('=').ok_or_else(|| {
            PolicyError::field(
                at("match"),
                format!("expected dimension=value, got {raw:?}"),
            )
        })?;
        let dimension = Name::parse(dimension)
            .map_err(|m| PolicyError::field(at("match"), format!("dimension {m}")))?;
        let pattern = Pattern::parse(pattern).map_err(|m| PolicyError::field(at("match"), m))?;
        let action = match obj.get("action").and_then(Value::as_str) {
            Some("unlimited") => Action::Unlimited,
            Some("block") => Action::Block,
            Some("limit") => Action::Rules(
                parse_rules(
                    obj.get("rules").ok_or_else(|| {
                        PolicyError::field(at("rules"), "is required when action is limit")
                    })?,
                    &at("rules"),
                )?
                .into_iter()
                .map(|mut rule| {
                    rule.of_override = true;
                    rule
                })
                .collect(),
            ),
            _ => {
                return Err(PolicyError::field(
                    at("action"),
                    "must be one of unlimited, block, limit",
                ));
            }
        };
        if !matches!(action, Action::Rules(_)) && obj.contains_key("rules") {
            return Err(PolicyError::field(
                at("rules"),
                "only an override with action limit has rules",
            ));
        }
        let expires_at_ms = match obj.get("expires_at_ms") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_i64().filter(|t| *t > 0).ok_or_else(|| {
                PolicyError::field(at("expires_at_ms"), "must be milliseconds since the epoch")
            })?),
        };
        let reason = match obj.get("reason") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) if s.len() <= 1024 => s.clone(),
            Some(_) => {
                return Err(PolicyError::field(
                    at("reason"),
                    "must be a string of at most 1024 bytes",
                ));
            }
        };
        Ok(Self {
            dimension,
            pattern,
            action,
            expires_at_ms,
            reason,
        })
    }

    /// Refuses an override added now whose expiry is already past: it would never apply.
    /// Only where one override is added (the overrides resource; the dashboard's form sets
    /// expiries from now on): a policy document saved whole (a file applied again, an export
    /// imported) keeps what it holds, and an expiry passing never makes it invalid.
    pub fn refuse_past_expiry(&self, path: &str, now_ms: i64) -> Result<(), PolicyError> {
        match self.expires_at_ms {
            Some(t) if t <= now_ms => Err(PolicyError::field(
                format!("{path}.expires_at_ms"),
                format!(
                    "{t} is not in the future (now is {now_ms}): the override would never apply"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Refuses an override whose match could never apply: a value longer than any
    /// identifier's or with a control character, or what is plainly meant as a CIDR but is
    /// not one (`10.0.0.0/33` would otherwise be kept as an exact value no address equals).
    /// `path` is where the override was found (`body`, `overrides[2]`).
    pub fn refuse_unmatchable(&self, path: &str) -> Result<(), PolicyError> {
        let at = |f: &str| format!("{path}.{f}");
        let (text, literal) = match &self.pattern {
            Pattern::Exact(s) => (s, s.len()),
            Pattern::Wildcard(s) => (s, s.bytes().filter(|b| *b != b'*').count()),
            Pattern::Cidr(_) => return Ok(()),
        };
        if literal > MAX_VALUE_BYTES {
            return Err(PolicyError::field(
                at("match"),
                format!(
                    "the value is {literal} bytes; identifier values are at most {MAX_VALUE_BYTES}, so it could never match"
                ),
            ));
        }
        if text.chars().any(char::is_control) {
            return Err(PolicyError::field(
                at("match"),
                "the value has a control character, which no identifier value may have",
            ));
        }
        if let Pattern::Exact(s) = &self.pattern
            && let Some((address, bits)) = s.rsplit_once('/')
            && address.parse::<IpAddr>().is_ok()
            && !bits.is_empty()
            && bits.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(PolicyError::field(
                at("match"),
                format!(
                    "{text} is not a CIDR: its prefix is at most 32 bits for IPv4 and 128 for IPv6"
                ),
            ));
        }
        Ok(())
    }

    /// Whether `self` and `other` match the same identifiers by the same pattern.
    pub fn same_match(&self, other: &Override) -> bool {
        self.dimension == other.dimension && self.pattern == other.pattern
    }

    /// Whether this override, listed after `earlier`, could never apply: ties go to the first
    /// listed, so it is shadowed while `earlier` lasts, and `earlier` lasts as long or longer.
    pub fn shadowed_by(&self, earlier: &Override) -> bool {
        self.same_match(earlier)
            && match (earlier.expires_at_ms, self.expires_at_ms) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(e), Some(s)) => e >= s,
            }
    }

    /// Whether this override applies to `identifier` at `now_ms`.
    pub fn applies(&self, identifier: &Identifier, now_ms: i64) -> bool {
        self.expires_at_ms.is_none_or(|t| now_ms < t)
            && self.dimension == *identifier.dimension()
            && self.pattern.matches(identifier.value())
    }
}

impl Serialize for Override {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry(
            "match",
            &format!("{}={}", self.dimension, self.pattern.as_string()),
        )?;
        match &self.action {
            Action::Unlimited => map.serialize_entry("action", "unlimited")?,
            Action::Block => map.serialize_entry("action", "block")?,
            Action::Rules(rules) => {
                map.serialize_entry("action", "limit")?;
                map.serialize_entry("rules", rules)?;
            }
        }
        if let Some(t) = self.expires_at_ms {
            map.serialize_entry("expires_at_ms", &t)?;
        }
        if !self.reason.is_empty() {
            map.serialize_entry("reason", &self.reason)?;
        }
        map.end()
    }
}

/// The override that applies to `identifier` at `now_ms`, by precedence; ties go to the
/// first listed.
pub fn best_match<'a>(
    overrides: &'a [Override],
    identifier: &Identifier,
    now_ms: i64,
) -> Option<&'a Override> {
    let mut best: Option<&Override> = None;
    for o in overrides.iter().filter(|o| o.applies(identifier, now_ms)) {
        if best.is_none_or(|b| o.pattern.precedence() > b.pattern.precedence()) {
            best = Some(o);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(doc: Value) -> Override {
        Override::from_document(&doc, "overrides[0]").unwrap()
    }

    fn id(raw: &str) -> Identifier {
        Identifier::parse(raw).unwrap()
    }

    #[test]
    fn exact_beats_wildcard_beats_cidr() {
        let list = vec![
            parse(json!({"match": "ip=10.0.0.0/8", "action": "block"})),
            parse(json!({"match": "ip=10.1.*", "action": "unlimited"})),
            parse(
                json!({"match": "ip=10.1.2.3", "action": "limit", "rules": [{"name": "r", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000}]}),
            ),
        ];
        assert!(matches!(
            best_match(&list, &id("ip=10.1.2.3"), 0).unwrap().action,
            Action::Rules(_)
        ));
        assert_eq!(
            best_match(&list, &id("ip=10.1.9.9"), 0).unwrap().action,
            Action::Unlimited
        );
        assert_eq!(
            best_match(&list, &id("ip=10.200.0.1"), 0).unwrap().action,
            Action::Block
        );
        assert!(best_match(&list, &id("ip=11.0.0.1"), 0).is_none());
        assert!(
            best_match(&list, &id("user=10.1.2.3"), 0).is_none(),
            "other dimension"
        );
    }

    /// A mapped IPv4 address does not escape an IPv4 block, and an exact match written in
    /// another spelling of the same address still matches.
    #[test]
    fn addresses_match_in_any_spelling() {
        let list = vec![
            parse(json!({"match": "ip=192.0.2.0/24", "action": "block"})),
            parse(json!({"match": "ip=2001:DB8:0::7", "action": "unlimited"})),
        ];
        assert_eq!(
            best_match(&list, &id("ip=::ffff:192.0.2.5"), 0)
                .unwrap()
                .action,
            Action::Block
        );
        assert_eq!(
            best_match(&list, &id("ip=2001:db8::0:7"), 0)
                .unwrap()
                .action,
            Action::Unlimited
        );
    }

    #[test]
    fn expired_overrides_do_not_apply() {
        let list = vec![parse(
            json!({"match": "user=42", "action": "unlimited", "expires_at_ms": 1000}),
        )];
        assert!(best_match(&list, &id("user=42"), 999).is_some());
        assert!(best_match(&list, &id("user=42"), 1000).is_none());
    }

    #[test]
    fn globs() {
        assert!(glob(b"vip-*", b"vip-7"));
        assert!(glob(b"*-admin", b"x-admin"));
        assert!(glob(b"a*b*c", b"aXbYc"));
        assert!(!glob(b"a*b*c", b"aXbY"));
        assert!(glob(b"*", b""));
    }

    #[test]
    fn a_serialized_override_parses_back_to_itself() {
        let o = parse(
            json!({"match": "ip=192.168.0.0/16", "action": "limit", "expires_at_ms": 5, "reason": "partner",
            "rules": [{"name": "r", "algorithm": "gcra", "rate": 5, "period_ms": 1000, "burst": 2}]}),
        );
        let back = Override::from_document(&serde_json::to_value(&o).unwrap(), "x").unwrap();
        assert_eq!(back, o);
    }

    /// An identifier `o` applies to, when there is one: its value with each `*` matching
    /// nothing (or one `x` when nothing would be left), or its network's first address.
    fn witness(o: &Override) -> Option<Identifier> {
        let value = match &o.pattern {
            Pattern::Exact(s) => s.clone(),
            Pattern::Wildcard(s) => match s.replace('*', "") {
                v if v.is_empty() => "x".to_owned(),
                v => v,
            },
            Pattern::Cidr(net) => net.network().to_string(),
        };
        Identifier::new(o.dimension.as_str(), &value).ok()
    }

    #[test]
    fn overrides_that_could_never_apply_are_refused_at_the_field() {
        let now = 1_700_000_000_000;
        let long = "v".repeat(MAX_VALUE_BYTES);
        for (doc, refused) in [
            (
                json!({"match": "user=1", "action": "block", "expires_at_ms": now}),
                Some("expires_at_ms"),
            ),
            (
                json!({"match": "user=1", "action": "block", "expires_at_ms": now + 1}),
                None,
            ),
            (
                json!({"match": "ip=10.0.0.0/33", "action": "block"}),
                Some("match"),
            ),
            (
                json!({"match": "ip=2001:db8::/129", "action": "block"}),
                Some("match"),
            ),
            (json!({"match": "ip=10.0.0.0/32", "action": "block"}), None),
            (json!({"match": "path=/v1/33", "action": "block"}), None),
            (json!({"match": "ip=10.0.0.0/8x", "action": "block"}), None),
            (
                json!({"match": format!("user={long}"), "action": "block"}),
                None,
            ),
            (
                json!({"match": format!("user={long}x"), "action": "block"}),
                Some("match"),
            ),
            (
                json!({"match": format!("user=*{long}*"), "action": "block"}),
                None,
            ),
            (
                json!({"match": format!("user=*{long}x*"), "action": "block"}),
                Some("match"),
            ),
            (json!({"match": "user=a\\tb", "action": "block"}), None),
            (
                json!({"match": "user=a\tb", "action": "block"}),
                Some("match"),
            ),
        ] {
            let o = parse(doc.clone());
            let got = o
                .refuse_unmatchable("body")
                .and_then(|()| o.refuse_past_expiry("body", now));
            match refused {
                Some(field) => assert_eq!(got.unwrap_err().field, format!("body.{field}"), "{doc}"),
                None => {
                    got.unwrap_or_else(|e| panic!("{doc}: {e:?}"));
                    assert!(o.applies(&witness(&o).unwrap(), now), "{doc}");
                }
            }
        }
    }

    proptest::proptest! {
        /// Every override the check lets through applies to some identifier now: matches of
        /// 250-265 bytes (the limit is 256) and short ones of the characters CIDRs,
        /// wildcards and paths use, expiries either side of now.
        #[test]
        fn an_override_that_passes_applies_to_someone(
            dimension in proptest::sample::select(vec!["ip", "user"]),
            value in "[0-9a-f:./*x\t]{1,8}|[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}/[0-9]{1,3}|[a-f0-9:]{2,20}/[0-9]{1,3}|[vx]{250,262}|\\*?[vx]{250,262}\\*[vx]{0,3}",
            expiry in proptest::option::of(-2i64..3),
        ) {
            let now = 1_700_000_000_000;
            let mut doc = json!({"match": format!("{dimension}={value}"), "action": "block"});
            if let Some(e) = expiry {
                doc["expires_at_ms"] = json!(now + e);
            }
            let Ok(o) = Override::from_document(&doc, "body") else { return Ok(()) };
            let passes = o
                .refuse_unmatchable("body")
                .and_then(|()| o.refuse_past_expiry("body", now));
            if passes.is_ok() {
                let id = witness(&o);
                let applies = id.as_ref().is_some_and(|id| o.applies(id, now));
                proptest::prop_assert!(applies, "{doc} {id:?}");
            }
        }
    }

    #[test]
    fn a_later_override_of_the_same_match_is_dead_while_an_earlier_one_lasts() {
        let o = |expiry: Option<i64>| {
            let mut doc = json!({"match": "user=bob", "action": "block"});
            if let Some(t) = expiry {
                doc["expires_at_ms"] = json!(t);
            }
            parse(doc)
        };
        assert!(o(Some(5)).shadowed_by(&o(None)));
        assert!(o(None).shadowed_by(&o(None)));
        assert!(o(Some(5)).shadowed_by(&o(Some(5))));
        assert!(o(Some(5)).shadowed_by(&o(Some(6))));
        assert!(
            !o(Some(6)).shadowed_by(&o(Some(5))),
            "applies once the earlier expires"
        );
        assert!(!o(None).shadowed_by(&o(Some(5))));
        let other = parse(json!({"match": "user=bo*", "action": "block"}));
        assert!(!other.shadowed_by(&o(None)), "another pattern");
    }

    #[test]
    fn errors_name_the_field() {
        for (doc, field) in [
            (json!({"action": "block"}), "overrides[0].match"),
            (
                json!({"match": "user", "action": "block"}),
                "overrides[0].match",
            ),
            (
                json!({"match": "user=1", "action": "maybe"}),
                "overrides[0].action",
            ),
            (
                json!({"match": "user=1", "action": "limit"}),
                "overrides[0].rules",
            ),
            (
                json!({"match": "user=1", "action": "block", "expires_at_ms": "soon"}),
                "overrides[0].expires_at_ms",
            ),
        ] {
            assert_eq!(
                Override::from_document(&doc, "overrides[0]")
                    .unwrap_err()
                    .field,
                field,
                "{doc}"
            );
        }
    }
}
