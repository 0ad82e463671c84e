//! Policies: the list; one policy's editor (fields per algorithm, validation messages beside
//! the fields, shadow mode), a burst preview computed with the domain model (in the browser
//! when hydrated), overrides with expiry, and the version history with diffs and rollback.
//!
//! Every form is an `ActionForm`, so it works with JavaScript off; the rules are posted as
//! `rules[i][field]`.

mod actions;
mod form;
mod list;
mod pages;
mod preview;
mod whatif;
mod words;

pub use actions::*;
pub use form::{UNITS, document_of, field_in_form, rule_form, rule_forms_from_pairs};
pub use list::PoliciesPage;
pub use pages::{OwnLimitFields, PolicyPage, own_limit_fields, rules_replaced};

use serde::{Deserialize, Serialize};

/// One page of the policy list: the policies that match the search, busy ones first (checks
/// in the last hour), then by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoliciesPageData {
    pub policies: Vec<PolicySummary>,
    /// Policies stored, and how many match the search.
    pub total: usize,
    pub matching: usize,
    /// This page (from 1) and how many there are.
    pub page: usize,
    pub pages: usize,
}

/// Policies a page of the list shows.
pub const POLICIES_PER_PAGE: usize = 50;

/// A row of the policy list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicySummary {
    pub name: String,
    pub description: String,
    pub shadow: bool,
    pub rules: usize,
    pub overrides: usize,
    pub version: u64,
    /// The Envoy domain it was loaded from, if it is one.
    #[serde(default)]
    pub envoy_domain: Option<String>,
    /// What keeps its file (`folder:<dir>`, `xds:<server>`), if not the dashboard.
    #[serde(default)]
    pub managed_by: Option<String>,
    /// Checks over the last hour, (all, denied, unmatched), when the history could be read.
    #[serde(default)]
    pub last_hour: Option<(u64, u64, u64)>,
    /// When it last changed, as far as the recent audit log tells.
    #[serde(default)]
    pub changed_ms: Option<i64>,
}

/// One rule as the editor's fields hold it. Which fields count depends on the algorithm.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleForm {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub algorithm: String,
    #[serde(default)]
    pub limit: String,
    #[serde(default)]
    pub window_ms: String,
    #[serde(default)]
    pub bucket_ms: String,
    #[serde(default)]
    pub capacity: String,
    /// Refill (token bucket) or leak (leaky bucket) amount.
    #[serde(default)]
    pub tokens: String,
    /// Refill, leak or GCRA period.
    #[serde(default)]
    pub period_ms: String,
    #[serde(default)]
    pub rate: String,
    #[serde(default)]
    pub burst: String,
    /// Concurrency: how long a lease is held unless released or renewed.
    #[serde(default)]
    pub lease_ms: String,
    /// Quota: day, week, month or year.
    #[serde(default)]
    pub period: String,
    /// Quota: an IANA time zone name; empty for UTC.
    #[serde(default)]
    pub time_zone: String,
    /// Quota: the anniversary (weekday 1–7 of a week, day of the month); empty for the 1st.
    #[serde(default)]
    pub start_day: String,
    /// Yearly quota: the month it starts in; empty for January.
    #[serde(default)]
    pub start_month: String,
    /// Comma-separated; empty for every dimension.
    #[serde(default)]
    pub dimensions: String,
    /// "on" when checked.
    #[serde(default)]
    pub count_denied: String,
    /// How the rule counts a check's cost: empty (its algorithm's default), `units`,
    /// `request`, or a weight.
    #[serde(default)]
    pub cost: String,
    /// The unit of each duration (`ms`, `s`, `min`, `h`, `d`; empty for ms), so a person
    /// writes "1 minute" rather than 60000.
    #[serde(default)]
    pub window_unit: String,
    #[serde(default)]
    pub bucket_unit: String,
    #[serde(default)]
    pub period_unit: String,
    #[serde(default)]
    pub lease_unit: String,
    /// The penalty box: how long an identifier stays denied once the rule denies it;
    /// empty for none.
    #[serde(default)]
    pub block_ms: String,
    #[serde(default)]
    pub block_unit: String,
    /// Limits sent with the request: what a caller may set, at most, as
    /// `limit=1000, window_ms=3600000`; empty for nothing.
    #[serde(default)]
    pub caller_max: String,
    /// Where its checks are decided: "exact" (or empty) in Redis, "local" on each instance.
    #[serde(default)]
    pub sync: String,
    /// A local rule's flush period in ms; empty for the default.
    #[serde(default)]
    pub flush_ms: String,
    /// "on": leave this rule out when saving.
    #[serde(default)]
    pub remove: String,
}

/// What a person typed into the editor, kept when a save fails so nothing is lost: shown
/// again in place of the stored policy, with the error beside its field. Without
/// JavaScript it travels in the page's address (`draft=`, JSON, percent-encoded).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Draft {
    pub description: String,
    pub shadow: bool,
    pub failure_closed: bool,
    /// Refuse checks no rule meets.
    #[serde(default)]
    pub strict: bool,
    /// The dimensions a check may leave out, comma-separated as typed.
    #[serde(default)]
    pub optional: String,
    /// Hold denied requests at forward-auth and Envoy's gRPC (`on_deny: wait`), up to
    /// `max_wait_ms`.
    #[serde(default)]
    pub wait: bool,
    #[serde(default)]
    pub max_wait_ms: String,
    pub rules: Vec<RuleForm>,
    /// The field the save refused (`rules[0].limit`; empty for none) and why.
    pub field: String,
    pub message: String,
}

impl Draft {
    /// The `draft` query value that carries it.
    pub fn to_query(&self) -> String {
        crate::domain::percent_encode(&serde_json::to_string(self).unwrap_or_default())
    }

    /// The draft in a query string (with or without its `?`), if it has one.
    pub fn from_search(search: &str) -> Option<Self> {
        let raw = crate::domain::query_value(search, "draft")?;
        serde_json::from_str(&raw).ok()
    }
}

/// An override as listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverrideRow {
    pub matcher: String,
    pub action: String,
    pub expires_at_ms: Option<i64>,
    pub reason: String,
    /// An own limit's fields as the form has them (limit, window, unit).
    #[serde(default)]
    pub limit_form: Option<(String, String, String)>,
}

/// One line of a diff: '+', '-' or ' ', and the text.
pub type DiffLine = (char, String);

/// A previous version and what the next version changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionRow {
    pub version: u64,
    pub diff: Vec<DiffLine>,
}

/// Everything the editor shows about one policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyView {
    pub name: String,
    pub exists: bool,
    pub version: u64,
    pub description: String,
    pub shadow: bool,
    pub failure_closed: bool,
    /// Whether it refuses checks no rule meets (a policy not saved yet will).
    #[serde(default)]
    pub strict: bool,
    /// The dimensions a check may leave out, comma-separated.
    #[serde(default)]
    pub optional: String,
    /// Whether denied requests are held (`on_deny: wait`), and for how long at most (ms).
    #[serde(default)]
    pub wait: bool,
    #[serde(default)]
    pub max_wait_ms: String,
    pub rules: Vec<RuleForm>,
    pub overrides: Vec<OverrideRow>,
    pub history: Vec<VersionRow>,
    /// Its checks over the last minute, (allowed, denied), when they could be read: what a
    /// change or a delete would touch.
    #[serde(default)]
    pub last_minute: Option<(u64, u64)>,
    /// Its checks over the last hour, (all, denied, unmatched), when the history could be
    /// read: unmatched ones met no rule and counted nothing.
    #[serde(default)]
    pub last_hour: Option<(u64, u64, u64)>,
    /// Its checks over the last hour that sent dimensions no rule counts, by those
    /// dimensions (`usr`), most first.
    #[serde(default)]
    pub unused: Vec<(String, u64)>,
    /// The policy document (JSON), for the preview.
    pub document: String,
    /// For an Envoy domain: its file (YAML), which is edited instead of the rules.
    #[serde(default)]
    pub envoy_file: Option<String>,
    /// What keeps the domain's file (`folder:<dir>`, `xds:<server>`): not edited here.
    #[serde(default)]
    pub managed_by: Option<String>,
    /// For an Envoy domain: how it counts a request over its limit.
    #[serde(default)]
    pub envoy_counting: Option<EnvoyCountingView>,
    /// For an Envoy domain: what to add to Envoy's configuration, (where, YAML).
    #[serde(default)]
    pub envoy_wiring: Vec<(String, String)>,
    /// An Envoy domain's descriptors that found no limit over the last hour, by their keys.
    #[serde(default)]
    pub envoy_unmatched: Vec<(String, u64)>,
}

/// How an Envoy domain counts a request over its limit, as its page shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvoyCountingView {
    /// `every_hit` or `all_or_nothing` when the domain says; `None`: the server's default.
    pub set: Option<String>,
    /// How it counts now (`every_hit` or `all_or_nothing`).
    pub counts: String,
    /// How a domain that does not say counts on this server.
    pub server_default: String,
}
