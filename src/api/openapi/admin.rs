//! The admin API's schemas: policies and their overrides, an inspection and its resets,
//! the audit log, Envoy domain files, alert rules and history.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;

use super::*;

/// A rule. Parameters depend on `algorithm`: `fixed_window`, `sliding_log`,
/// `sliding_window`: limit, window_ms; `token_bucket`: capacity, refill_tokens,
/// refill_period_ms; `leaky_bucket`: capacity, leak_tokens, leak_period_ms; `gcra`: rate,
/// period_ms, burst; `bucketed_window`: limit, window_ms, bucket_ms; `concurrency`: limit,
/// lease_ms; `quota`: limit, period, and optionally time_zone, start_day, start_month.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleDocument {
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    name: String,
    algorithm: AlgorithmName,
    dimensions: Option<Vec<String>>,
    count_denied: Option<bool>,
    /// How the rule counts a check's cost: `"units"` (the check's cost; every rule's
    /// default but concurrency's), `"request"` (1 per check; concurrency's default) or a
    /// whole-number weight the cost is multiplied by.
    cost: Option<RuleCost>,
    /// The penalty box: once this rule denies an identifier, it stays denied for this
    /// many ms from that moment, whatever the rule's own state says (1 ms to 400 days;
    /// left out for none). A reset lifts it.
    #[schema(minimum = 1, maximum = 34_560_000_000_u64)]
    block_ms: Option<u64>,
    /// Limits sent with the request: the most a caller may set each of this rule's
    /// amounts to for one check (`{"limit": 1000}`): `limit`, `capacity`,
    /// `refill_tokens`, `leak_tokens`, `rate` or `burst` (never a duration, and never on
    /// a concurrency rule). Left out: callers may set none.
    caller_max: Option<BTreeMap<String, u64>>,
    /// Where the rule's checks are decided: `exact` (the default: in Redis, every check) or
    /// `local` (each instance answers from its own counter and adds what it admitted to
    /// Redis every `flush_ms`; approximate, for hot identifiers: instances together may
    /// pass the limit by about what each admits between its flushes). Not for `concurrency`,
    /// `sliding_log` or `leaky_bucket`, nor with `block_ms`.
    sync: Option<SyncName>,
    /// A local rule's flush period, 10 ms to a minute (default 100).
    #[schema(minimum = 10, maximum = 60_000)]
    flush_ms: Option<u64>,
    limit: Option<u64>,
    window_ms: Option<u64>,
    capacity: Option<u64>,
    refill_tokens: Option<u64>,
    refill_period_ms: Option<u64>,
    leak_tokens: Option<u64>,
    leak_period_ms: Option<u64>,
    rate: Option<u64>,
    period_ms: Option<u64>,
    burst: Option<u64>,
    bucket_ms: Option<u64>,
    /// Concurrency: how long a lease is held unless released or renewed (≤ a day).
    lease_ms: Option<u64>,
    /// Quota: the calendar period.
    period: Option<QuotaPeriod>,
    /// Quota: an IANA time zone name (default UTC).
    time_zone: Option<String>,
    /// Quota: the anniversary: ISO weekday 1-7 for a week, day 1-31 for a month or year.
    start_day: Option<u8>,
    /// Yearly quota: the month it starts in, 1-12.
    start_month: Option<u8>,
}

/// A rule's `cost`: `"units"`, `"request"`, or a weight (1 to 1000000).
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum RuleCost {
    Model(RuleCostModel),
    Weight(u64),
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RuleCostModel {
    Units,
    Request,
}

/// An override: `match` is `dimension=value`, `dimension=prefix-*` or `ip=10.0.0.0/8`.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OverrideDocument {
    r#match: String,
    action: OverrideAction,
    /// With action `limit`: the rules that apply instead.
    rules: Option<Vec<RuleDocument>>,
    expires_at_ms: Option<i64>,
    reason: Option<String>,
}

/// What `PUT /api/v1/policies/{name}` takes.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyDocument {
    description: Option<String>,
    mode: Option<PolicyMode>,
    failure_mode: Option<FailureMode>,
    /// Refuse a check whose identifiers meet no rule (400, `unmatched-identifiers`) or
    /// that sends a dimension no rule counts (400, `unknown-dimensions`), rather than let
    /// it through uncounted or half counted. Left out: as the version it replaces, and
    /// true for a new policy.
    strict: Option<bool>,
    /// Dimensions the rules count whose absence is a normal case: a check that gives none
    /// of the policy's dimensions, all of them optional, passes uncounted even when strict
    /// (a per-user policy's anonymous callers). Each must be one a rule counts.
    optional: Option<Vec<String>>,
    /// What forward-auth and Envoy's gRPC do with a denied request: `refuse` it at once
    /// (the default), or `wait`: hold it until it would pass, up to `max_wait_ms` and the
    /// caller's deadline, then check again. The JSON check always answers at once.
    on_deny: Option<OnDenyName>,
    /// With `on_deny: wait` only: the longest a denied request is held (1 to 60000 ms).
    #[schema(minimum = 1, maximum = 60000)]
    max_wait_ms: Option<u64>,
    /// Which checks are recorded for what-if replays: `sample` (the default: every check
    /// while the record's budget holds a day of them, then those of one identifier in 2, 4,
    /// 8…), `every` (every check, the newest within the budget) or `off`.
    record: Option<RecordName>,
    /// At most this many of its checks in the record (1 to 10,000,000; the server's
    /// `SPILLWAY_RECORD_CHECKS` caps it). Absent: the server's.
    #[schema(minimum = 1, maximum = 10000000)]
    record_checks: Option<u64>,
    rules: Vec<RuleDocument>,
    overrides: Option<Vec<OverrideDocument>>,
}

/// `record`: which checks are recorded for what-if replays.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RecordName {
    Sample,
    Every,
    Off,
}

/// `on_deny`: refuse a denied request at once, or wait until it would pass.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnDenyName {
    Refuse,
    Wait,
}

/// A stored policy: its document plus name and version.
#[derive(Serialize, ToSchema)]
pub struct PolicyView {
    name: String,
    version: u64,
    description: String,
    mode: PolicyMode,
    failure_mode: FailureMode,
    /// Absent for a policy saved before there was the choice: lenient.
    strict: Option<bool>,
    /// Absent: none.
    optional: Option<Vec<String>>,
    /// Absent: `refuse`.
    on_deny: Option<OnDenyName>,
    max_wait_ms: Option<u64>,
    rules: Vec<RuleDocument>,
    overrides: Vec<OverrideDocument>,
}

#[derive(Serialize, ToSchema)]
pub struct PolicyList {
    policies: Vec<PolicyView>,
}

#[derive(Serialize, ToSchema)]
pub struct PolicyVersions {
    policy: String,
    previous_versions: Vec<PolicyView>,
}

#[derive(Serialize, ToSchema)]
pub struct OverrideList {
    policy: String,
    version: u64,
    overrides: Vec<OverrideDocument>,
}

/// One rule's state for an inspected identifier (nothing consumed).
#[derive(Serialize, ToSchema)]
pub struct InspectedRule {
    rule: String,
    algorithm: String,
    /// The identifier this rule counts (`dimension=value`, or several joined by `&`).
    identifier: String,
    limit: u64,
    remaining: u64,
    reset_ms: u64,
    /// Milliseconds until Redis drops the state; null when none is kept now.
    ttl_ms: Option<i64>,
    /// The rule that would deny first.
    binding: bool,
    /// When a request of cost 1 would next pass; null when it would pass now.
    retry_after_ms: Option<u64>,
    /// Concurrency rules: the leases held now, soonest to run out first.
    leases: Vec<InspectedLease>,
}

/// A lease a concurrency rule holds for the identifier.
#[derive(Serialize, ToSchema)]
pub struct InspectedLease {
    /// Its id, to release it.
    id: String,
    cost: u64,
    /// Since it was taken.
    age_ms: u64,
    /// Until it runs out unless renewed.
    expires_in_ms: u64,
}

/// One policy's view of an inspected identifier.
#[derive(Serialize, ToSchema)]
pub struct InspectedPolicy {
    policy: String,
    version: u64,
    /// `rules`, or `unlimited` / `blocked` by an override.
    status: String,
    rules: Vec<InspectedRule>,
}

/// An identifier's state in every policy, at `at_ms`.
#[derive(Serialize, ToSchema)]
pub struct Inspection {
    identifier: String,
    at_ms: i64,
    policies: Vec<InspectedPolicy>,
    /// Why nothing could be shown.
    error: Option<String>,
}

/// What a reset did.
#[derive(Serialize, ToSchema)]
pub struct ResetResult {
    identifier: String,
    /// The policies whose counters were reset.
    policies: Vec<String>,
    deleted_keys: u64,
    /// Present when counters were deleted: how to put them back within a minute.
    undo: Option<ResetUndoOffer>,
}

/// A reset's counters are kept for a minute: `POST /api/v1/resets/{token}/undo` puts them
/// back, once.
#[derive(Serialize, ToSchema)]
pub struct ResetUndoOffer {
    token: String,
    /// Until when (Unix ms).
    until_ms: i64,
}

/// What an undo put back.
#[derive(Serialize, ToSchema)]
pub struct ResetUndone {
    identifiers: Vec<String>,
    restored_keys: u64,
}

/// One audit record: who did what to what, when, from where and why.
#[derive(Serialize, ToSchema)]
pub struct AuditRecord {
    /// The record's id (`<ms>-<seq>`); pass it as `before` to page on.
    id: String,
    time_ms: i64,
    /// `user:<name>`, `key:<name>`, `cli:<os user>`.
    actor: String,
    role: String,
    /// Dotted verb: `policy.save`, `identifier.reset`, `login.failure`, ...
    action: String,
    target: String,
    /// JSON document before the change (empty when none).
    before: String,
    /// JSON document after the change (empty when none).
    after: String,
    ip: String,
    reason: String,
}

/// An Envoy rate limit domain in envoyproxy/ratelimit's file format (sent as YAML with
/// `Content-Type: application/yaml`, or as this JSON).
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvoyDomainFile {
    /// The domain Envoy's rate limit filter names (may be left out: the path's).
    domain: Option<String>,
    descriptors: Option<Vec<EnvoyDescriptor>>,
}

/// One snippet of Envoy's configuration that asks this server about a domain.
#[derive(Serialize, ToSchema)]
pub struct WiringPart {
    /// Where it goes in Envoy's configuration.
    #[serde(rename = "where")]
    place: String,
    /// The YAML to add there.
    yaml: String,
}

/// A descriptor of the tree: a key, an optional value (ending in `*`: a prefix), a limit,
/// and nested descriptors.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvoyDescriptor {
    key: String,
    value: Option<String>,
    rate_limit: Option<EnvoyRateLimit>,
    shadow_mode: Option<bool>,
    replaces: Option<Vec<EnvoyReplaces>>,
    detailed_metric: Option<bool>,
    #[schema(no_recursion)]
    descriptors: Option<Vec<EnvoyDescriptor>>,
}

#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvoyRateLimit {
    /// second, minute, hour, day, week, month (30 days) or year (365 days), any case.
    unit: Option<String>,
    /// 0 always denies; at most 10^9, as every limit (the protocol's uint32 would allow more).
    #[schema(minimum = 0, maximum = 1_000_000_000)]
    requests_per_unit: Option<u64>,
    /// Always allowed (then neither unit nor requests_per_unit).
    unlimited: Option<bool>,
    name: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvoyReplaces {
    name: String,
}

/// A page of the audit log, newest first.
#[derive(Serialize, ToSchema)]
pub struct AuditPage {
    entries: Vec<AuditRecord>,
    /// The id to pass as `before` for older records; null when there are none.
    older: Option<String>,
}

/// An alert rule: what it watches, where it posts, how it signs.
#[derive(Serialize, ToSchema)]
#[schema(example = json!({"condition": {"kind": "policy_denials", "policy": "api", "per_second": 50.0, "for_seconds": 120}, "webhook_url": "https://hooks.example.com/spillway", "secret": "a long shared secret"}))]
pub struct AlertRuleDocument {
    /// Set from the path.
    name: Option<String>,
    condition: AlertCondition,
    /// http or https; redirects are not followed.
    webhook_url: String,
    /// 16 to 256 characters; deliveries carry `X-Spillway-Signature: t=<s>,v1=<hex HMAC-SHA256 of "<t>.<body>">`. Shown as `(set)` afterwards.
    secret: String,
    /// Default true.
    enabled: Option<bool>,
}

/// `policy_denials`: the policy's denials a second, averaged over `for_seconds` (1-290),
/// above `per_second`. `identifier_throttled`: an identifier denied in each of the last
/// `minutes` minutes (1-5), by `policy` or any. `degraded`: checks failing on Redis for
/// more than `seconds` (1-3600), watched and sent by each instance.
#[derive(Serialize, ToSchema)]
pub struct AlertCondition {
    /// `policy_denials`, `identifier_throttled` or `degraded`.
    kind: String,
    policy: Option<String>,
    per_second: Option<f64>,
    for_seconds: Option<u32>,
    minutes: Option<u32>,
    seconds: Option<u32>,
}

/// The rules, what fires now, and the latest deliveries (newest first).
#[derive(Serialize, ToSchema)]
pub struct AlertsDocument {
    rules: Vec<AlertRuleDocument>,
    /// `{id, rule, subject, since_ms, figures}`.
    firing: Vec<serde_json::Value>,
    /// `{id, rule, event, url, attempt, outcome, detail, at_ms}`.
    deliveries: Vec<serde_json::Value>,
}

/// A history read: the series, its totals and the top lists.
#[derive(Serialize, ToSchema)]
pub struct HistoryDocument {
    /// The policy, or `*` for every policy together.
    policy: String,
    /// `1h`, `24h`, `7d`, `30d` or `90d`.
    range: String,
    /// `minute`, `hour` or `day`.
    step: String,
    step_ms: u64,
    /// One per period, oldest first, the current (partial) period last.
    points: Vec<HistoryPoint>,
    totals: HistoryCounts,
    top_denied: Vec<HistoryRanked>,
    top_checked: Vec<HistoryRanked>,
    /// How exact the top lists' counts are.
    top_accuracy: String,
    /// The first period's start, `2026-11-24 10:00 UTC`.
    from: String,
}

/// One period's checks.
#[derive(Serialize, ToSchema)]
pub struct HistoryPoint {
    /// The period's start, `2026-11-24T10:00:00Z`.
    time: String,
    /// The same, in ms since the epoch.
    t_ms: i64,
    allowed: u64,
    denied: u64,
    shadow_denied: u64,
    /// Answered by the failure mode while Redis was unreachable.
    degraded: u64,
    /// Checks whose identifiers met no rule (let through uncounted, or refused by a
    /// strict policy).
    unmatched: u64,
}

/// Checks over a whole range.
#[derive(Serialize, ToSchema)]
pub struct HistoryCounts {
    allowed: u64,
    denied: u64,
    shadow_denied: u64,
    degraded: u64,
    /// Checks whose identifiers met no rule.
    unmatched: u64,
}

/// An identifier in a top list.
#[derive(Serialize, ToSchema)]
pub struct HistoryRanked {
    policy: String,
    /// `dimension=value`.
    identifier: String,
    count: u64,
}

/// A what-if replay to run: a draft's rules over the policy's recorded checks.
#[derive(Serialize, ToSchema)]
pub struct WhatIfRequest {
    /// The draft, a policy document as PUT takes it (without `overrides`, the ones in force
    /// apply); absent, with no `version`: the policy in force (its replay reproduces what
    /// happened: a check of the record).
    policy: Option<PolicyDocument>,
    /// A stored version to replay instead of a draft, under the overrides in force: what
    /// rolling back to it would change.
    version: Option<u64>,
    /// How far back, in ms (1 to a day; default an hour).
    last_ms: Option<i64>,
}

/// An identifier (or a check's identifiers, joined by ", "), a rule, and a count of checks.
#[derive(Serialize, ToSchema)]
pub struct WhatIfCounted {
    identifier: String,
    checks: u64,
}

/// The minute the replayed rules deny most.
#[derive(Serialize, ToSchema)]
pub struct WhatIfPeak {
    /// Its start, ms since the epoch.
    at_ms: i64,
    denied: u64,
}

/// What the replayed rules would have done to the recorded checks, against what happened.
#[derive(Serialize, ToSchema)]
pub struct WhatIfAnswer {
    checks: u64,
    from_ms: Option<i64>,
    to_ms: Option<i64>,
    allowed_then: u64,
    denied_then: u64,
    allowed: u64,
    denied: u64,
    /// Allowed then, denied by the replayed rules.
    newly_denied: u64,
    /// Denied then, allowed by the replayed rules.
    newly_allowed: u64,
    /// Denials by the rule that bound (`override`: a blocking override; `cost`: a cost no
    /// rule admits), in `identifier`.
    denied_by_rule: Vec<WhatIfCounted>,
    /// Identifiers newly denied, most first (at most 10).
    newly_throttled: Vec<WhatIfCounted>,
    /// Checks newly allowed, by their identifiers, most first (at most 10).
    newly_freed: Vec<WhatIfCounted>,
    peak_minute: Option<WhatIfPeak>,
    /// Rules not replayed (concurrency: releases are not recorded).
    not_replayed: Vec<String>,
    /// False when the replay's 5 s budget ran out: the answer covers checks up to `to_ms`.
    complete: bool,
    /// 1 when every check was recorded; else the record keeps the checks of one identifier
    /// in this many, and the counts are estimates: the kept checks' times this (the top
    /// lists are the kept identifiers' own counts).
    one_in: u64,
    /// About two standard errors of `newly_denied` when sampled (0 when not).
    newly_denied_bound: u64,
    /// About two standard errors of `newly_allowed` when sampled (0 when not).
    newly_allowed_bound: u64,
}

/// A limit that would have throttled only the busiest identifiers.
#[derive(Serialize, ToSchema)]
pub struct TopLimit {
    top: u64,
    limit: u64,
    /// The identifiers whose busiest window is above `limit`.
    throttled: Vec<String>,
    /// Checks a replay of the policy with this limit newly denies.
    newly_denied: u64,
}

/// Suggested limits for a rule, from the recorded checks: each identifier's busiest window.
#[derive(Serialize, ToSchema)]
pub struct LimitSuggestion {
    rule: String,
    window_ms: u64,
    limit_now: u64,
    identifiers: u64,
    p50: u64,
    p99: u64,
    max: u64,
    /// For the top 1, 2 and 3 identifiers.
    limits: Vec<TopLimit>,
    /// 1 when every check was recorded; else the record keeps one identifier in this many,
    /// and the figures are of the kept ones.
    one_in: u64,
}
