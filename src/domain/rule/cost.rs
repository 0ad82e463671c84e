//! What a check costs a rule: the check's own cost, or a weight per identifier value.

use serde::Serialize;

use super::*;

/// How a rule counts a check's cost (`"cost"` on a rule).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CostModel {
    /// The check's cost (tokens, bytes): every rule's default but a concurrency rule's.
    Units,
    /// One per check whatever its cost (none for a peek): a concurrency rule's default, so
    /// a token budget and "2 in flight" share a policy.
    Request,
    /// The check's cost times this weight (1 to [`MAX_WEIGHT`]).
    Weight(u64),
}

/// The largest weight a rule may give a check's cost.
pub const MAX_WEIGHT: u64 = 1_000_000;

impl CostModel {
    /// What a check of `cost` counts under this model.
    pub fn of(self, cost: u64) -> u64 {
        match self {
            CostModel::Units => cost,
            CostModel::Request => cost.min(1),
            CostModel::Weight(w) => cost.saturating_mul(w),
        }
    }

    /// Reads `"units"`, `"request"` or a weight; `at` names the field.
    pub fn parse(value: &serde_json::Value, at: &str) -> Result<Self, PolicyError> {
        match value {
            serde_json::Value::String(s) if s == "units" => Ok(CostModel::Units),
            serde_json::Value::String(s) if s == "request" => Ok(CostModel::Request),
            serde_json::Value::Number(n) => match n.as_u64() {
                Some(w) if (1..=MAX_WEIGHT).contains(&w) => Ok(CostModel::Weight(w)),
                _ => Err(PolicyError::field(
                    at,
                    format!("a weight must be a whole number from 1 to {MAX_WEIGHT}"),
                )),
            },
            _ => Err(PolicyError::field(
                at,
                "must be \"units\" (the check's cost), \"request\" (1 per check) or a weight",
            )),
        }
    }
}

impl Serialize for CostModel {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            CostModel::Units => s.serialize_str("units"),
            CostModel::Request => s.serialize_str("request"),
            CostModel::Weight(w) => s.serialize_u64(*w),
        }
    }
}
