//! An identifier's state in every policy, as the inspector shows it and the admin API
//! returns it. Plain data: the server fills it (`service::identifiers`), the browser shows it.

use serde::{Deserialize, Serialize};

/// One rule's state for the identifier.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleState {
    pub rule: String,
    pub algorithm: String,
    pub identifier: String,
    pub limit: u64,
    pub remaining: u64,
    pub reset_ms: u64,
    /// Milliseconds until Redis drops the state (`None`: no state kept now).
    pub ttl_ms: Option<i64>,
    pub binding: bool,
    pub retry_after_ms: Option<u64>,
    /// A concurrency rule: the leases held now, soonest to run out first.
    #[serde(default)]
    pub leases: Vec<LeaseView>,
}

/// A lease held by a concurrency rule, as the inspector lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseView {
    /// Its id, to release it.
    pub id: String,
    pub cost: u64,
    /// Since it was taken.
    pub age_ms: u64,
    /// Until it runs out unless renewed.
    pub expires_in_ms: u64,
}

/// One policy's view of the identifier.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyState {
    pub policy: String,
    pub version: u64,
    /// `rules`, or `unlimited` / `blocked` by an override.
    pub status: String,
    pub rules: Vec<RuleState>,
}

/// The identifier in every policy, at `at_ms`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inspection {
    pub identifier: String,
    pub at_ms: i64,
    pub policies: Vec<PolicyState>,
    /// Why nothing could be shown (a malformed identifier, Redis down).
    pub error: Option<String>,
}
