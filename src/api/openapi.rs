//! The OpenAPI 3.1 document of the JSON API, generated from the handlers' annotations and
//! the schema types below (they describe the wire format; parsing is done by the domain).

#![allow(dead_code)] // the schema types exist only to be described

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::{
    Modify, OpenApi, ToSchema,
    openapi::security::{Http, HttpAuthScheme, SecurityScheme},
};

mod admin;
pub use admin::*;

/// A check: may these identifiers do this now under this policy?
#[derive(Serialize, ToSchema)]
#[schema(example = json!({"policy": "api", "identifiers": {"ip": "203.0.113.7", "user": "42"}, "cost": 1}))]
#[serde(deny_unknown_fields)]
pub struct CheckRequest {
    /// Policy name, `[a-z0-9][a-z0-9_-]{0,63}`.
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    policy: String,
    identifiers: Identifiers,
    /// Integer ≥ 0, default 1; 0 peeks without consuming.
    #[schema(minimum = 0, maximum = 1_000_000_000)]
    cost: Option<u64>,
    /// Limits sent with the request: `{"<rule>": {"limit": 500}}` sets the named rule's
    /// numbers (by parameter field) for this check only, each at most what the rule's
    /// `caller_max` says; a rule without one refuses them (400, `field`
    /// `limits.<rule>`). Counters are kept per set of numbers, and the answer's headers
    /// describe the limit applied.
    limits: Option<BTreeMap<String, BTreeMap<String, u64>>>,
}

/// Up to 16 `dimension: value` pairs (a report's at least 1; a check's may be none: an
/// anonymous caller, let through by a policy whose dimensions are all `optional`):
/// dimensions match `[a-z0-9][a-z0-9_-]{0,63}`, values are UTF-8, 1 to 256 bytes, without
/// control characters.
#[derive(Serialize, ToSchema)]
pub struct Identifiers(BTreeMap<String, IdentifierValue>);

/// An identifier value: UTF-8, 1 to 256 bytes, no control characters.
#[derive(Serialize)]
pub struct IdentifierValue(String);

impl utoipa::PartialSchema for IdentifierValue {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .pattern(Some("^[^\\x00-\\x1f\\x7f]{1,256}$"))
            .into()
    }
}

impl ToSchema for IdentifierValue {}

/// A file's bytes as uploaded (`string`, `format: binary`).
pub struct FileBytes;

impl utoipa::PartialSchema for FileBytes {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                utoipa::openapi::KnownFormat::Binary,
            )))
            .into()
    }
}

impl ToSchema for FileBytes {}

/// What a policy does with a denial: `enforce` answers 429, `shadow` answers 200 and says
/// it would have denied.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PolicyMode {
    Enforce,
    Shadow,
}

/// What a check answers while Redis is unreachable: `open` lets it through (`degraded`),
/// `closed` answers 503.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    Open,
    Closed,
}

/// Where a rule's checks are decided.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SyncName {
    Exact,
    Local,
}

/// A rule's algorithm.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AlgorithmName {
    FixedWindow,
    SlidingLog,
    SlidingWindow,
    TokenBucket,
    LeakyBucket,
    Gcra,
    BucketedWindow,
    Concurrency,
    Quota,
}

/// What evaluated a result: a rule's algorithm, or `block` (an override that blocks the
/// identifier).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResultAlgorithm {
    FixedWindow,
    SlidingLog,
    SlidingWindow,
    TokenBucket,
    LeakyBucket,
    Gcra,
    BucketedWindow,
    Concurrency,
    Quota,
    Block,
}

/// A quota's calendar period.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum QuotaPeriod {
    Day,
    Week,
    Month,
    Year,
}

/// What an override does.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OverrideAction {
    Unlimited,
    Block,
    Limit,
}

/// One rule × identifier evaluated by a check.
#[derive(Serialize, ToSchema)]
pub struct RuleResult {
    rule: String,
    identifier: String,
    algorithm: ResultAlgorithm,
    allowed: bool,
    limit: u64,
    remaining: u64,
    reset_ms: u64,
    retry_after_ms: Option<u64>,
    binding: bool,
    /// Leaky bucket only.
    delay_ms: Option<u64>,
    /// Concurrency rules of an allowed check: the lease it holds, to release or renew.
    lease: Option<String>,
    /// Present and true when the rule's penalty box denied: the rule denied this
    /// identifier a moment ago (its `block_ms`) and holds it until `retry_after_ms`.
    penalty: Option<bool>,
}

/// The answer to a check (200 allowed, 429 denied; the same body either way).
#[derive(Serialize, ToSchema)]
pub struct CheckResponse {
    allowed: bool,
    policy: String,
    policy_version: u64,
    mode: PolicyMode,
    limit: Option<u64>,
    remaining: Option<u64>,
    reset_ms: Option<u64>,
    retry_after_ms: Option<u64>,
    degraded: bool,
    /// No rule of the policy met any identifier (a misspelt dimension, say): let through
    /// and nothing counted, never an allow by a limit. Also said by the header
    /// `Spillway-Unmatched: ?1`. A `strict` policy refuses such a check with a 400 instead.
    unmatched: bool,
    /// Dimensions the check sent that none of the policy's rules counts (a misspelt `usr`
    /// beside a correct `ip`): those identifiers limited nothing. Absent when none; also
    /// said by the header `Spillway-Unused` (`"usr"`). A `strict` policy refuses such a
    /// check with a 400 (`unknown-dimensions`) instead.
    unused: Option<Vec<String>>,
    /// Shadow mode only: the check would have been denied.
    shadow_denied: Option<bool>,
    /// Redis Cluster only: a later slot denied and earlier slots were refunded.
    refunded: Option<bool>,
    results: Vec<RuleResult>,
}

#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// 1 to 100 checks.
    #[schema(min_items = 1, max_items = 100)]
    checks: Vec<CheckRequest>,
}

#[derive(Serialize, ToSchema)]
pub struct BatchItem {
    status: u16,
    /// A `CheckResponse` (200, 429), or a `Problem` (any other status).
    body: BatchItemBody,
}

#[derive(Serialize, ToSchema)]
pub struct BatchResponse {
    results: Vec<BatchItem>,
}

/// One batch answer's body: the check's answer when it was decided (`status` 200 or 429),
/// else the problem (`status` 4xx or 5xx, `type` set). Tell them apart by `status`.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub enum BatchItemBody {
    Check(CheckResponse),
    Problem(Problem),
}

/// RFC 9457 problem details. `type` is `https://spillway.dev/problems/` and one of:
/// `invalid-request` (400), `unmatched-identifiers` (400), `unknown-dimensions` (400),
/// `unauthorized` (401),
/// `forbidden` (403), `unknown-policy` (404), `not-found` (404), `method-not-allowed`
/// (405), `conflict` (409), `payload-too-large` (413), `unsupported-media-type` (415),
/// `cost-too-high` (422), `redis-unavailable` (503), `policies-not-loaded` (503),
/// `shutting-down` (503), `timeout` (504).
#[derive(Serialize, ToSchema)]
pub struct Problem {
    r#type: String,
    title: String,
    status: u16,
    /// Starts with the offending field's name, when one is to blame.
    detail: String,
    /// The offending field: on `invalid-request` (400), `unmatched-identifiers` and
    /// `unknown-dimensions` (`identifiers`), and `cost-too-high` (`cost`).
    field: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct Status {
    status: String,
}

/// Leases to release or renew: `leases`, or one `lease`.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// 1 to 100 lease ids, as checks answered them (`results[].lease`).
    #[schema(min_items = 1, max_items = 100)]
    leases: Option<Vec<String>>,
    lease: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct LeaseReleased {
    lease: String,
    /// Whether it was held until now (false: released before, or it ran out).
    released: bool,
}

#[derive(Serialize, ToSchema)]
pub struct LeaseRelease {
    results: Vec<LeaseReleased>,
}

#[derive(Serialize, ToSchema)]
pub struct LeaseRenewed {
    lease: String,
    renewed: bool,
    /// Milliseconds until it runs out now; null when it was not renewed.
    expires_in_ms: Option<u64>,
}

#[derive(Serialize, ToSchema)]
pub struct LeaseRenewal {
    results: Vec<LeaseRenewed>,
}

/// Usage known after the fact.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportRequest {
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    policy: String,
    identifiers: Identifiers,
    /// What to add, counted even past the limit; negative gives back (never below nothing).
    #[schema(minimum = -1_000_000_000, maximum = 1_000_000_000)]
    cost: i64,
}

/// A rule's state after a report.
#[derive(Serialize, ToSchema)]
pub struct ReportedRule {
    rule: String,
    identifier: String,
    algorithm: String,
    limit: u64,
    remaining: u64,
    reset_ms: u64,
}

#[derive(Serialize, ToSchema)]
pub struct ReportResponse {
    policy: String,
    policy_version: u64,
    cost: i64,
    results: Vec<ReportedRule>,
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The refusals every keyed operation can answer, declared once: 401 (no or unknown key),
/// 403 for the admin operations (a key or role that may not do this), 503 (Redis down).
struct CommonProblems;

impl Modify for CommonProblems {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder, path::Operation};
        let problem = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/problem+json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Problem")))
                        .build(),
                )
                .build()
        };
        let add = |op: &mut Operation| {
            let tags = op.tags.clone().unwrap_or_default();
            if tags.iter().any(|t| t == "health") {
                return;
            }
            let admin = !tags.iter().any(|t| t == "checks");
            let mut wanted = vec![
                ("401", "No key, or one that is not known"),
                ("503", "Redis is unreachable; retry after `Retry-After`"),
            ];
            if admin {
                wanted.push(("403", "This key or role may not do this"));
            }
            for (status, description) in wanted {
                let responses = &mut op.responses.responses;
                if !responses.contains_key(status) {
                    responses.insert(status.to_owned(), problem(description).into());
                }
            }
        };
        for item in openapi.paths.paths.values_mut() {
            let ops = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
            ];
            ops.into_iter().flatten().for_each(add);
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Spillway", description = "Rate limiting over HTTP, backed by Redis."),
    paths(
        super::healthz,
        super::readyz,
        super::healthcheck,
        super::metrics,
        openapi_json,
        super::check::check_handler,
        super::check::batch_handler,
        super::check::forward_auth_handler,
        super::report::report,
        super::leases::release,
        super::leases::renew,
        super::policies::list,
        super::policies::read,
        super::policies::put,
        super::policies::delete,
        super::policies::versions,
        super::policies::list_overrides,
        super::policies::add_override,
        super::policies::remove_override,
        super::whatif::what_if,
        super::whatif::suggestions,
        super::identifiers::inspect,
        super::identifiers::reset,
        super::identifiers::undo_reset,
        super::audit::list,
        super::history::read,
        super::history::read_csv,
        super::alerts::list,
        super::alerts::put,
        super::alerts::delete,
        super::envoy::put,
        super::envoy::read,
        super::envoy::wiring,
    ),
    components(schemas(CheckRequest, IdentifierValue, CheckResponse, RuleResult, BatchRequest, BatchResponse, BatchItem, Problem,
        RuleDocument, OverrideDocument, PolicyDocument, PolicyView, PolicyList, PolicyVersions, OverrideList, Status,
        Inspection, InspectedPolicy, InspectedRule, InspectedLease, ResetResult, ResetUndoOffer, ResetUndone, RuleCost, RuleCostModel, BatchItemBody, Identifiers,
        PolicyMode, FailureMode, OnDenyName, AlgorithmName, ResultAlgorithm, QuotaPeriod, OverrideAction, AuditRecord, AuditPage,
        EnvoyDomainFile, WiringPart, EnvoyDescriptor, EnvoyRateLimit, EnvoyReplaces,
        HistoryDocument, HistoryPoint, HistoryCounts, HistoryRanked,
        AlertRuleDocument, AlertCondition, AlertsDocument,
        LeaseRequest, LeaseReleased, LeaseRelease, LeaseRenewed, LeaseRenewal,
        ReportRequest, ReportedRule, ReportResponse,
        WhatIfRequest, WhatIfCounted, WhatIfPeak, WhatIfAnswer, TopLimit, LimitSuggestion)),
    modifiers(&BearerAuth, &CommonProblems),
    security(("api_key" = [])),
    tags(
        (name = "checks", description = "May this caller do this now? (service keys)"),
        (name = "policies", description = "Versioned policies (admin keys)"),
        (name = "overrides", description = "Per-identifier exceptions to a policy (admin keys)"),
        (name = "identifiers", description = "An identifier's live state, and resetting it (admin keys)"),
        (name = "audit", description = "Who changed what, when and why (admin keys)"),
        (name = "alerts", description = "Alert rules and their webhooks (admin keys)"),
        (name = "history", description = "Checks over time and who was denied most (admin keys)"),
        (name = "envoy", description = "Envoy rate limit domains, in envoyproxy/ratelimit's file format (admin keys)"),
        (name = "health", description = "Probes, metrics and this document"),
    ),
)]
pub struct ApiDoc;

/// This document.
#[utoipa::path(get, path = "/api/openapi.json", tag = "health", operation_id = "openapi_document", security(()), responses((status = 200, description = "The OpenAPI document")))]
pub async fn openapi_json() -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(ApiDoc::openapi())
}
