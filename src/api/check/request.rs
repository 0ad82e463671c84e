//! Reading a check request: a well-formed body straight into its parts (borrowed strings,
//! no JSON tree), anything else through the parse that names the wrong field.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::MAX_IDENTIFIERS;
use crate::{
    api::ApiError,
    domain::Identifier,
    service::{CheckRequest, check::MAX_COST},
};

impl CheckRequest {
    /// Parses a check request's JSON from the bytes of a body. A well-formed request (string
    /// identifiers, no unknown or repeated field) is read straight into its parts; anything
    /// else goes through `parse`, which names the field that is wrong. Both give the same
    /// answer for every input (a property test holds them to it).
    pub fn from_body(bytes: &[u8]) -> Result<Self, ApiError> {
        match serde_json::from_slice::<WellFormed<'_>>(bytes) {
            Ok(body) => Self::from_parts(body.policy.into_owned(), body.identifiers.0, body.cost),
            Err(_) => Self::parse(&super::JsonBody::parse(bytes)?.0, ""),
        }
    }

    /// Parses a check request's JSON; `path` prefixes field names (batch items).
    pub fn parse(value: &Value, path: &str) -> Result<Self, ApiError> {
        let at = |f: &str| format!("{path}{f}");
        let obj = value.as_object().ok_or_else(|| {
            ApiError::bad(
                if path.is_empty() {
                    "body".into()
                } else {
                    path.trim_end_matches('.').to_owned()
                },
                "must be a JSON object",
            )
        })?;
        refuse_unknown_fields(obj, path)?;
        let policy = obj
            .get("policy")
            .ok_or_else(|| ApiError::bad(at("policy"), "is required"))?
            .as_str()
            .ok_or_else(|| ApiError::bad(at("policy"), "must be a string"))?
            .to_owned();
        let identifiers = parse_identifiers(obj, path)?;
        let cost = match obj.get("cost") {
            None | Some(Value::Null) => 1,
            Some(v) => v.as_u64().filter(|c| *c <= MAX_COST).ok_or_else(|| {
                ApiError::bad(
                    at("cost"),
                    format!("must be a whole number from 0 to {MAX_COST}"),
                )
            })?,
        };
        Ok(Self {
            policy,
            identifiers,
            cost,
            limits: parse_limits(obj, path)?,
        })
    }

    /// Validates the parts of a well-formed request, with `parse`'s errors in `parse`'s
    /// order (count, each identifier, cost).
    fn from_parts(
        policy: String,
        mut ids: Vec<(&str, &str)>,
        cost: Option<u64>,
    ) -> Result<Self, ApiError> {
        ids.sort_by(|a, b| a.0.cmp(b.0));
        // None is an anonymous check: let through by a policy whose dimensions are all
        // optional, refused by a strict one that counts one, and unmatched by the rest.
        if ids.len() > MAX_IDENTIFIERS {
            return Err(ApiError::bad(
                "identifiers",
                format!("must hold at most {MAX_IDENTIFIERS} identifiers"),
            ));
        }
        let identifiers = ids
            .iter()
            .map(|(dimension, value)| {
                Identifier::new(dimension, value)
                    .map_err(|m| ApiError::bad(format!("identifiers.{dimension}"), m))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cost = match cost {
            None => 1,
            Some(c) if c <= MAX_COST => c,
            Some(_) => {
                return Err(ApiError::bad(
                    "cost",
                    format!("must be a whole number from 0 to {MAX_COST}"),
                ));
            }
        };
        Ok(Self {
            policy,
            identifiers,
            cost,
            limits: Default::default(),
        })
    }
}

/// A check request's `limits`: `{"<rule>": {"<parameter>": n}}`, the numbers of the
/// policy's rules for this check only (the service holds them to each rule's caller_max).
fn parse_limits(
    obj: &Map<String, Value>,
    path: &str,
) -> Result<std::collections::BTreeMap<String, std::collections::BTreeMap<String, u64>>, ApiError> {
    let at = |f: &str| format!("{path}{f}");
    let mut out = std::collections::BTreeMap::new();
    let rules = match obj.get("limits") {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::Object(rules)) => rules,
        Some(_) => {
            return Err(ApiError::bad(
                at("limits"),
                "must be an object of rule: {parameter: number}",
            ));
        }
    };
    for (rule, numbers) in rules {
        let numbers = numbers
            .as_object()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                ApiError::bad(
                    at(&format!("limits.{rule}")),
                    "must be an object of parameter: number, such as {\"limit\": 500}",
                )
            })?;
        let mut parsed = std::collections::BTreeMap::new();
        for (field, n) in numbers {
            let n = n.as_u64().ok_or_else(|| {
                ApiError::bad(
                    at(&format!("limits.{rule}.{field}")),
                    "must be a whole number",
                )
            })?;
            parsed.insert(field.clone(), n);
        }
        out.insert(rule.clone(), parsed);
    }
    Ok(out)
}

/// Refuses a member of a check request other than policy, identifiers and cost; `path`
/// prefixes field names (batch items).
fn refuse_unknown_fields(obj: &Map<String, Value>, path: &str) -> Result<(), ApiError> {
    let at = |f: &str| format!("{path}{f}");
    if let Some(k) = obj
        .keys()
        .find(|k| !["policy", "identifiers", "cost", "limits"].contains(&k.as_str()))
    {
        if k.is_empty() {
            // A member named "" is named by where it is: the body, or this batch item.
            let whole = at("").trim_end_matches('.').to_owned();
            return Err(ApiError::bad(
                if whole.is_empty() {
                    "body".to_owned()
                } else {
                    whole
                },
                "has a member with an empty name (expected policy, identifiers, cost, limits)",
            ));
        }
        return Err(ApiError::bad(
            at(k),
            "is not a known field (expected policy, identifiers, cost, limits)",
        ));
    }
    Ok(())
}

/// A check request's `identifiers`, in order of dimension; `path` prefixes field names
/// (batch items).
fn parse_identifiers(obj: &Map<String, Value>, path: &str) -> Result<Vec<Identifier>, ApiError> {
    let at = |f: &str| format!("{path}{f}");
    let ids = obj
        .get("identifiers")
        .ok_or_else(|| ApiError::bad(at("identifiers"), "is required"))?
        .as_object()
        .ok_or_else(|| ApiError::bad(at("identifiers"), "must be an object of dimension: value"))?;
    if ids.len() > MAX_IDENTIFIERS {
        return Err(ApiError::bad(
            at("identifiers"),
            format!("must hold at most {MAX_IDENTIFIERS} identifiers"),
        ));
    }
    // In order of dimension, whatever the order in the body (and whichever map
    // serde_json was built with): the order of the results and of the checks.
    let mut ids: Vec<(&String, &Value)> = ids.iter().collect();
    ids.sort_by(|a, b| a.0.cmp(b.0));
    ids.into_iter()
        .map(|(dimension, v)| {
            let field = at(&format!("identifiers.{dimension}"));
            let value = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => return Err(ApiError::bad(field, "must be a string")),
            };
            Identifier::new(dimension, &value).map_err(|m| ApiError::bad(field, m))
        })
        .collect()
}

/// A check request in its expected shape, read without building a JSON tree.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WellFormed<'a> {
    #[serde(borrow)]
    policy: Cow<'a, str>,
    #[serde(borrow)]
    identifiers: StringIdentifiers<'a>,
    #[serde(default)]
    cost: Option<u64>,
}

/// `identifiers` as an object of strings, in order, borrowed from the body. A repeated
/// dimension, a value that is not a string, or a string with escapes (which cannot be
/// borrowed) is an error here, and `parse` then gives the answer.
struct StringIdentifiers<'a>(Vec<(&'a str, &'a str)>);

impl<'de: 'a, 'a> Deserialize<'de> for StringIdentifiers<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = StringIdentifiers<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of strings")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut ids: Vec<(&'a str, &'a str)> = Vec::with_capacity(2);
                while let Some(key) = map.next_key::<&'de str>()? {
                    if ids.iter().any(|(k, _)| *k == key) {
                        return Err(serde::de::Error::custom("a repeated dimension"));
                    }
                    let value = map.next_value::<&'de str>()?;
                    ids.push((key, value));
                    if ids.len() > MAX_IDENTIFIERS {
                        return Err(serde::de::Error::custom("too many identifiers"));
                    }
                }
                Ok(StringIdentifiers(ids))
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::api::JsonBody;

    /// What a parse came to, comparable: the request's parts or the error's text.
    fn outcome(r: Result<CheckRequest, ApiError>) -> Result<(String, Vec<String>, u64), String> {
        r.map(|c| {
            (
                c.policy,
                c.identifiers.iter().map(|i| i.to_string()).collect(),
                c.cost,
            )
        })
        .map_err(|e| format!("{e:?}"))
    }

    fn slow(body: &str) -> Result<(String, Vec<String>, u64), String> {
        outcome(JsonBody::parse(body.as_bytes()).and_then(|v| CheckRequest::parse(&v.0, "")))
    }

    fn json_value() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("\"web\"".to_owned()),
            Just("\"\"".to_owned()),
            Just("\"a\\\"b\"".to_owned()),
            Just("\"caf\\u00e9\"".to_owned()),
            Just("\"tab\\there\"".to_owned()),
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("[]".to_owned()),
            Just("{}".to_owned()),
            (0u64..3_000_000_000).prop_map(|n| n.to_string()),
            Just("-1".to_owned()),
            Just("2.5".to_owned()),
            Just("1e3".to_owned()),
            "[a-z0-9_]{1,6}".prop_map(|s| format!("\"{s}\"")),
        ]
    }

    fn identifiers() -> impl Strategy<Value = String> {
        let key = prop_oneof![
            Just("user".to_owned()),
            Just("ip".to_owned()),
            Just("User".to_owned()),
            Just("".to_owned()),
            Just("a|b".to_owned()),
            "[a-z]{1,3}",
        ];
        prop_oneof![
            prop::collection::vec((key, json_value()), 0..19).prop_map(|pairs| {
                let members: Vec<String> = pairs
                    .into_iter()
                    .map(|(k, v)| format!("\"{k}\":{v}"))
                    .collect();
                format!("{{{}}}", members.join(","))
            }),
            json_value(),
        ]
    }

    /// Mostly the shape a service sends (so the fast path runs, and its checks of names,
    /// values and cost are exercised), with every part sometimes something else.
    fn nearly_well_formed() -> impl Strategy<Value = String> {
        let policy =
            prop_oneof![3 => "[a-z]{1,5}".prop_map(|s| format!("\"{s}\"")), 1 => json_value()];
        let value = prop_oneof![
            4 => "[a-z0-9.]{0,8}".prop_map(|s| format!("\"{s}\"")),
            1 => Just(format!("\"{}\"", "x".repeat(300))),
            1 => json_value(),
        ];
        let key = prop_oneof![4 => "(user|ip|key|org)", 1 => "[A-Za-z|_ -]{0,4}"];
        let ids = prop_oneof![
            4 => prop::collection::vec((key, value), 0..5).prop_map(|pairs| {
                let members: Vec<String> = pairs.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                format!("{{{}}}", members.join(","))
            }),
            1 => identifiers(),
        ];
        let cost = prop_oneof![
            2 => Just(None),
            2 => (0u64..1_100_000_000).prop_map(|n| Some(n.to_string())),
            1 => json_value().prop_map(Some),
        ];
        (policy, ids, cost, any::<bool>()).prop_map(|(p, i, c, swap)| {
            let mut members = vec![format!("\"policy\":{p}"), format!("\"identifiers\":{i}")];
            if let Some(c) = c {
                members.push(format!("\"cost\":{c}"));
            }
            if swap {
                members.reverse();
            }
            format!("{{{}}}", members.join(","))
        })
    }

    fn body() -> impl Strategy<Value = String> {
        let member = prop_oneof![
            json_value().prop_map(|v| format!("\"policy\":{v}")),
            identifiers().prop_map(|v| format!("\"identifiers\":{v}")),
            json_value().prop_map(|v| format!("\"cost\":{v}")),
            json_value().prop_map(|v| format!("\"extra\":{v}")),
        ];
        prop_oneof![
            8 => nearly_well_formed(),
            4 => prop::collection::vec(member, 0..5).prop_map(|m| format!("{{{}}}", m.join(","))),
            1 => json_value(),
            1 => Just("{\"policy\":\"web\",".to_owned()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// The well-formed fast path and the field-naming parse agree on every body:
        /// the same request, or the same error.
        #[test]
        fn the_fast_parse_agrees_with_the_tree_parse(body in body()) {
            prop_assert_eq!(outcome(CheckRequest::from_body(body.as_bytes())), slow(&body), "{}", body);
        }
    }

    #[test]
    fn a_plain_request_takes_the_fast_path() {
        let body = r#"{"policy":"web","identifiers":{"user":"42","ip":"10.0.0.1"},"cost":2}"#;
        assert!(serde_json::from_slice::<WellFormed<'_>>(body.as_bytes()).is_ok());
        let parsed = CheckRequest::from_body(body.as_bytes()).unwrap();
        assert_eq!(parsed.policy, "web");
        assert_eq!(parsed.cost, 2);
        let ids: Vec<String> = parsed.identifiers.iter().map(|i| i.to_string()).collect();
        // In order of dimension, as the tree parse gives them.
        assert_eq!(ids, ["ip=10.0.0.1", "user=42"]);
    }
}
