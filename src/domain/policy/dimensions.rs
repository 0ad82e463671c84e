//! Which dimensions a policy counts, and what a check's identifiers make of them: the
//! dimensions it sent that nothing of the policy counts (`unused`, a typo until shown
//! otherwise), and the `optional` ones whose absence is a normal case (anonymous traffic).

use serde_json::{Map, Value};

use super::{Identifier, Name, Policy, PolicyError};

impl Policy {
    /// The dimensions of `identifiers` that no rule of this policy counts and no override
    /// names, each once, in the order given: a misspelt `usr` beside a correct `ip`.
    pub fn unused_dimensions(&self, identifiers: &[Identifier]) -> Vec<Name> {
        let mut unused: Vec<Name> = Vec::new();
        for identifier in identifiers {
            let dimension = identifier.dimension();
            if !self.knows(dimension.as_str()) && !unused.contains(dimension) {
                unused.push(dimension.clone());
            }
        }
        unused
    }

    /// The dimensions this policy's rules count that `identifiers` lack, sorted (none when a
    /// rule counts every dimension).
    pub fn missing_dimensions(&self, identifiers: &[Identifier]) -> Vec<&str> {
        let mut missing = self.dimensions().unwrap_or_default();
        missing.retain(|d| !identifiers.iter().any(|i| i.dimension().as_str() == *d));
        missing
    }

    /// Whether a rule counts `dimension` (a rule without dimensions counts every one) or
    /// an override names it.
    fn knows(&self, dimension: &str) -> bool {
        self.rules.iter().any(|r| r.applies_to(dimension))
            || self
                .overrides
                .iter()
                .any(|o| o.dimension.as_str() == dimension)
    }

    /// Whether a check that gave none of the dimensions this policy counts is a normal
    /// one: every dimension its rules count is declared optional (a user-only policy's
    /// anonymous callers). It is let through uncounted, not refused as a strict policy's
    /// unmatched check.
    pub fn anonymous_allowed(&self) -> bool {
        !self.optional.is_empty()
            && self.dimensions().is_some_and(|dims| {
                dims.iter()
                    .all(|d| self.optional.iter().any(|o| o.as_str() == *d))
            })
    }
}

/// A policy's `optional`: dimensions its rules count whose absence from a check is a
/// normal case. Each must be one a rule counts (a name no rule counts is a typo here too).
pub(super) fn parse_optional(
    obj: &Map<String, Value>,
    rules: &[super::Rule],
) -> Result<Vec<Name>, PolicyError> {
    let items = match obj.get("optional") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(PolicyError::field(
                "optional",
                "must be an array of dimension names",
            ));
        }
    };
    let counted: Vec<&str> = rules
        .iter()
        .flat_map(|r| r.dimensions.iter().flatten().map(Name::as_str))
        .collect();
    let mut optional: Vec<Name> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("optional[{i}]");
        let name = item
            .as_str()
            .ok_or_else(|| PolicyError::field(&at, "must be a string"))
            .and_then(|s| Name::parse(s).map_err(|m| PolicyError::field(&at, m)))?;
        if !counted.contains(&name.as_str()) {
            let mut known = counted.clone();
            known.sort_unstable();
            known.dedup();
            return Err(PolicyError::field(
                at,
                format!(
                    "{name} is not a dimension any rule counts (they count {})",
                    if known.is_empty() {
                        "every dimension".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        }
        if !optional.contains(&name) {
            optional.push(name);
        }
    }
    Ok(optional)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::domain::{Identifier, Policy};

    fn policy(doc: serde_json::Value) -> Policy {
        Policy::from_document("p", &doc).expect("valid")
    }

    fn ids(pairs: &[(&str, &str)]) -> Vec<Identifier> {
        pairs
            .iter()
            .map(|(d, v)| Identifier::new(d, v).expect("valid"))
            .collect()
    }

    const TWO: &str = r#"{"rules": [
        {"name": "per-user", "algorithm": "fixed_window", "limit": 2, "window_ms": 60000, "dimensions": ["user"]},
        {"name": "per-ip", "algorithm": "fixed_window", "limit": 100, "window_ms": 60000, "dimensions": ["ip"]}]}"#;

    #[test]
    fn a_misspelt_dimension_beside_a_correct_one_is_unused() {
        let p = policy(serde_json::from_str(TWO).unwrap());
        let unused = p.unused_dimensions(&ids(&[("ip", "1.2.3.4"), ("usr", "bob"), ("usr", "x")]));
        assert_eq!(
            unused.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
            ["usr"]
        );
        assert!(
            p.unused_dimensions(&ids(&[("ip", "1"), ("user", "bob")]))
                .is_empty()
        );
    }

    #[test]
    fn an_override_names_a_dimension_and_a_rule_without_dimensions_counts_all() {
        let mut doc: serde_json::Value = serde_json::from_str(TWO).unwrap();
        doc["overrides"] = json!([{"match": "team=core", "action": "unlimited", "reason": "r"}]);
        let p = policy(doc);
        assert!(p.unused_dimensions(&ids(&[("team", "core")])).is_empty());
        let all = policy(
            json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 1000}]}),
        );
        assert!(all.unused_dimensions(&ids(&[("anything", "x")])).is_empty());
    }

    #[test]
    fn optional_names_counted_dimensions_and_allows_anonymous_only_when_all_are() {
        let mut doc: serde_json::Value = serde_json::from_str(TWO).unwrap();
        doc["optional"] = json!(["user"]);
        let p = policy(doc.clone());
        assert!(!p.anonymous_allowed(), "ip is still required");
        doc["optional"] = json!(["user", "ip"]);
        assert!(policy(doc.clone()).anonymous_allowed());
        doc["optional"] = json!(["usr"]);
        let e = Policy::from_document("p", &doc).unwrap_err();
        assert_eq!(e.field, "optional[0]");
        assert!(e.message.contains("they count ip, user"), "{}", e.message);
        assert!(!policy(serde_json::from_str(TWO).unwrap()).anonymous_allowed());
    }
}
