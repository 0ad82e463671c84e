//! Rules and their algorithms, parsed from the policy document's JSON (docs/services.md, "The API").
//! Once a `Rule` exists its parameters are valid: every check below names the field.

use serde::{Deserialize, Serialize};

use super::{
    Name, PolicyError,
    calendar::{Calendar, Period, ZoneName},
};

/// Largest limit, capacity, rate or burst a rule may have.
pub const MAX_AMOUNT: u64 = 1_000_000_000;
/// Longest window or period: 400 days, in milliseconds.
pub const MAX_PERIOD_MS: u64 = 400 * 24 * 3600 * 1000;
/// Most buckets a bucketed window may have.
pub const MAX_BUCKETS: u64 = 3600;
/// Most a concurrency rule may hold at once (each lease is an entry in Redis).
pub const MAX_LEASES: u64 = 100_000;
/// Longest lease: a day. A holder that needs longer renews.
pub const MAX_LEASE_MS: u64 = 24 * 3600 * 1000;
/// The numbers a caller may set for one check (`caller_max`): amounts, where a bigger
/// number is a looser rule and a cap bounds it.
pub const CALLER_AMOUNTS: [&str; 6] = [
    "limit",
    "capacity",
    "refill_tokens",
    "leak_tokens",
    "rate",
    "burst",
];

/// The longest penalty a rule may give (`block_ms`): 400 days, as the longest period.
pub const MAX_BLOCK_MS: u64 = MAX_PERIOD_MS;

/// How often a local rule's counts reach Redis by default (`flush_ms`).
pub const DEFAULT_FLUSH_MS: u64 = 100;
/// The range `flush_ms` may take: 10 ms to a minute.
pub const MIN_FLUSH_MS: u64 = 10;
pub const MAX_FLUSH_MS: u64 = 60_000;

/// Where a rule's checks are decided (`sync`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncMode {
    /// In Redis, atomically, every check: exact across instances.
    #[default]
    Exact,
    /// On each instance, from its own counter; what it counted reaches Redis every
    /// `flush_ms`, and it learns the others' totals then. Approximate: see
    /// `domain::local` for the bound on overshoot.
    Local,
}

impl SyncMode {
    pub fn is_exact(&self) -> bool {
        *self == SyncMode::Exact
    }
}

/// An algorithm with its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "algorithm", rename_all = "snake_case")]
pub enum Algorithm {
    FixedWindow {
        limit: u64,
        window_ms: u64,
    },
    SlidingLog {
        limit: u64,
        window_ms: u64,
    },
    SlidingWindow {
        limit: u64,
        window_ms: u64,
    },
    TokenBucket {
        capacity: u64,
        refill_tokens: u64,
        refill_period_ms: u64,
    },
    LeakyBucket {
        capacity: u64,
        leak_tokens: u64,
        leak_period_ms: u64,
    },
    Gcra {
        rate: u64,
        period_ms: u64,
        burst: u64,
    },
    BucketedWindow {
        limit: u64,
        window_ms: u64,
        bucket_ms: u64,
    },
    /// At most `limit` held at once: an allowed check holds a lease of its cost for
    /// `lease_ms`, until it is released, renewed, or reclaimed when it runs out.
    Concurrency {
        limit: u64,
        lease_ms: u64,
    },
    /// `limit` per calendar period (day, week, month, year) in a time zone, starting on an
    /// anniversary if one is given (see `calendar.rs`).
    Quota {
        limit: u64,
        period: Period,
        time_zone: ZoneName,
        #[serde(default, skip_serializing_if = "is_zero")]
        start_day: u8,
        #[serde(default, skip_serializing_if = "is_zero")]
        start_month: u8,
    },
}

fn is_zero(v: &u8) -> bool {
    *v == 0
}

/// One parameter of an algorithm: its field in policy documents, and the editor's input
/// that holds it (token and leaky buckets share "tokens" and "period_ms").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Param {
    pub field: &'static str,
    pub input: &'static str,
}

/// What each algorithm is called and takes: its name in documents and answers, its code in
/// the check script (`lua/<name>.lua` registers under it), its label in the editor, and its
/// parameters in the order the script takes them. Parsing, the editor, the store's script
/// arguments and every name come from this one table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlgorithmKind {
    pub name: &'static str,
    pub code: &'static str,
    pub label: &'static str,
    pub params: &'static [Param],
}

const fn param(field: &'static str, input: &'static str) -> Param {
    Param { field, input }
}

/// Every algorithm, in the editor's order. A quota's calendar fields (`period`,
/// `time_zone`, `start_day`, `start_month`) are not numbers of the table: the policy parser
/// and the editor handle them.
pub const ALGORITHMS: [AlgorithmKind; 9] = [
    AlgorithmKind {
        name: "fixed_window",
        code: "fw",
        label: "Fixed window",
        params: &[param("limit", "limit"), param("window_ms", "window_ms")],
    },
    AlgorithmKind {
        name: "sliding_window",
        code: "sw",
        label: "Sliding window (approximate)",
        params: &[param("limit", "limit"), param("window_ms", "window_ms")],
    },
    AlgorithmKind {
        name: "sliding_log",
        code: "lw",
        label: "Sliding log (exact)",
        params: &[param("limit", "limit"), param("window_ms", "window_ms")],
    },
    AlgorithmKind {
        name: "token_bucket",
        code: "tb",
        label: "Token bucket",
        params: &[
            param("capacity", "capacity"),
            param("refill_tokens", "tokens"),
            param("refill_period_ms", "period_ms"),
        ],
    },
    AlgorithmKind {
        name: "leaky_bucket",
        code: "lb",
        label: "Leaky bucket",
        params: &[
            param("capacity", "capacity"),
            param("leak_tokens", "tokens"),
            param("leak_period_ms", "period_ms"),
        ],
    },
    AlgorithmKind {
        name: "gcra",
        code: "gc",
        label: "GCRA",
        params: &[
            param("rate", "rate"),
            param("period_ms", "period_ms"),
            param("burst", "burst"),
        ],
    },
    AlgorithmKind {
        name: "bucketed_window",
        code: "bw",
        label: "Bucketed window",
        params: &[
            param("limit", "limit"),
            param("window_ms", "window_ms"),
            param("bucket_ms", "bucket_ms"),
        ],
    },
    AlgorithmKind {
        name: "concurrency",
        code: "cc",
        label: "Concurrency (leases)",
        params: &[param("limit", "limit"), param("lease_ms", "lease_ms")],
    },
    AlgorithmKind {
        name: "quota",
        code: "qt",
        label: "Calendar quota",
        params: &[param("limit", "limit")],
    },
];

impl AlgorithmKind {
    /// The algorithm called `name` in documents.
    pub fn named(name: &str) -> Option<&'static AlgorithmKind> {
        ALGORITHMS.iter().find(|k| k.name == name)
    }

    /// This algorithm with `values`, one per parameter in the table's order.
    pub fn with(&self, values: &[u64]) -> Option<Algorithm> {
        let v = |i: usize| values.get(i).copied();
        Some(match self.name {
            "fixed_window" => Algorithm::FixedWindow {
                limit: v(0)?,
                window_ms: v(1)?,
            },
            "sliding_window" => Algorithm::SlidingWindow {
                limit: v(0)?,
                window_ms: v(1)?,
            },
            "sliding_log" => Algorithm::SlidingLog {
                limit: v(0)?,
                window_ms: v(1)?,
            },
            "token_bucket" => Algorithm::TokenBucket {
                capacity: v(0)?,
                refill_tokens: v(1)?,
                refill_period_ms: v(2)?,
            },
            "leaky_bucket" => Algorithm::LeakyBucket {
                capacity: v(0)?,
                leak_tokens: v(1)?,
                leak_period_ms: v(2)?,
            },
            "gcra" => Algorithm::Gcra {
                rate: v(0)?,
                period_ms: v(1)?,
                burst: v(2)?,
            },
            "bucketed_window" => Algorithm::BucketedWindow {
                limit: v(0)?,
                window_ms: v(1)?,
                bucket_ms: v(2)?,
            },
            "concurrency" => Algorithm::Concurrency {
                limit: v(0)?,
                lease_ms: v(1)?,
            },
            // A daily quota in UTC; the parser sets the calendar fields.
            "quota" => Algorithm::Quota {
                limit: v(0)?,
                period: Period::Day,
                time_zone: ZoneName::UTC,
                start_day: 0,
                start_month: 0,
            },
            _ => return None,
        })
    }
}

impl Algorithm {
    /// Its entry in [`ALGORITHMS`].
    pub fn kind(&self) -> &'static AlgorithmKind {
        let name = match self {
            Algorithm::FixedWindow { .. } => "fixed_window",
            Algorithm::SlidingLog { .. } => "sliding_log",
            Algorithm::SlidingWindow { .. } => "sliding_window",
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::LeakyBucket { .. } => "leaky_bucket",
            Algorithm::Gcra { .. } => "gcra",
            Algorithm::BucketedWindow { .. } => "bucketed_window",
            Algorithm::Concurrency { .. } => "concurrency",
            Algorithm::Quota { .. } => "quota",
        };
        AlgorithmKind::named(name).expect("every algorithm is in the table")
    }

    /// The name used in documents and responses.
    pub fn name(&self) -> &'static str {
        self.kind().name
    }

    /// Its parameters in the table's order (what the check script takes as p1..p3; 0 for
    /// one an algorithm does not have).
    pub fn params(&self) -> [u64; 3] {
        match *self {
            Algorithm::FixedWindow { limit, window_ms }
            | Algorithm::SlidingLog { limit, window_ms }
            | Algorithm::SlidingWindow { limit, window_ms } => [limit, window_ms, 0],
            Algorithm::TokenBucket {
                capacity,
                refill_tokens,
                refill_period_ms,
            } => [capacity, refill_tokens, refill_period_ms],
            Algorithm::LeakyBucket {
                capacity,
                leak_tokens,
                leak_period_ms,
            } => [capacity, leak_tokens, leak_period_ms],
            Algorithm::Gcra {
                rate,
                period_ms,
                burst,
            } => [rate, period_ms, burst],
            Algorithm::BucketedWindow {
                limit,
                window_ms,
                bucket_ms,
            } => [limit, window_ms, bucket_ms],
            Algorithm::Concurrency { limit, lease_ms } => [limit, lease_ms, 0],
            Algorithm::Quota { limit, .. } => [limit, 0, 0],
        }
    }

    /// A quota's calendar.
    pub fn calendar(&self) -> Option<Calendar> {
        match *self {
            Algorithm::Quota {
                period,
                time_zone,
                start_day,
                start_month,
                ..
            } => Some(Calendar {
                period,
                zone: time_zone,
                start_day,
                start_month,
            }),
            _ => None,
        }
    }

    /// The most one request may cost and still be admitted by an empty rule.
    pub fn max_admissible(&self) -> u64 {
        match *self {
            Algorithm::FixedWindow { limit, .. }
            | Algorithm::SlidingLog { limit, .. }
            | Algorithm::SlidingWindow { limit, .. }
            | Algorithm::BucketedWindow { limit, .. }
            | Algorithm::Concurrency { limit, .. }
            | Algorithm::Quota { limit, .. } => limit,
            Algorithm::TokenBucket { capacity, .. } | Algorithm::LeakyBucket { capacity, .. } => {
                capacity
            }
            Algorithm::Gcra { burst, .. } => burst + 1,
        }
    }

    /// The window the IETF `RateLimit-Policy` header advertises, in whole seconds (≥ 1).
    pub fn window_seconds(&self) -> u64 {
        let ms = match *self {
            Algorithm::FixedWindow { window_ms, .. }
            | Algorithm::SlidingLog { window_ms, .. }
            | Algorithm::SlidingWindow { window_ms, .. }
            | Algorithm::BucketedWindow { window_ms, .. } => window_ms,
            // Time for an empty bucket to refill completely.
            Algorithm::TokenBucket {
                capacity,
                refill_tokens,
                refill_period_ms,
            } => capacity.saturating_mul(refill_period_ms) / refill_tokens.max(1),
            Algorithm::LeakyBucket {
                capacity,
                leak_tokens,
                leak_period_ms,
            } => capacity.saturating_mul(leak_period_ms) / leak_tokens.max(1),
            Algorithm::Gcra {
                rate,
                period_ms,
                burst,
            } => (burst + 1).saturating_mul(period_ms) / rate.max(1),
            // How long a lease is held unless released.
            Algorithm::Concurrency { lease_ms, .. } => lease_ms,
            Algorithm::Quota { period, .. } => period.nominal_seconds() * 1000,
        };
        ms.div_ceil(1000).max(1)
    }

    /// Checks every parameter of rule number `rule`; the error names the first that is out
    /// of range (`rules[<rule>].<field>`).
    fn validate(&self, rule: usize) -> Result<(), PolicyError> {
        let amount = |name: &str, v: u64| check_amount(rule, name, v);
        let period = |name: &str, v: u64| check_period(rule, name, v);
        match *self {
            Algorithm::FixedWindow { limit, window_ms }
            | Algorithm::SlidingLog { limit, window_ms }
            | Algorithm::SlidingWindow { limit, window_ms } => {
                amount("limit", limit)?;
                period("window_ms", window_ms)?;
                if matches!(self, Algorithm::SlidingLog { .. }) && limit > 100_000 {
                    return Err(PolicyError::field(
                        field(rule, "limit"),
                        "a sliding_log keeps one entry per request: at most 100000; use sliding_window for more",
                    ));
                }
            }
            Algorithm::TokenBucket {
                capacity,
                refill_tokens,
                refill_period_ms,
            } => {
                amount("capacity", capacity)?;
                amount("refill_tokens", refill_tokens)?;
                period("refill_period_ms", refill_period_ms)?;
            }
            Algorithm::LeakyBucket {
                capacity,
                leak_tokens,
                leak_period_ms,
            } => {
                amount("capacity", capacity)?;
                amount("leak_tokens", leak_tokens)?;
                period("leak_period_ms", leak_period_ms)?;
            }
            Algorithm::Gcra {
                rate,
                period_ms,
                burst,
            } => {
                amount("rate", rate)?;
                period("period_ms", period_ms)?;
                if burst >= MAX_AMOUNT {
                    return Err(PolicyError::field(
                        field(rule, "burst"),
                        format!("must be between 0 and {}", MAX_AMOUNT - 1),
                    ));
                }
            }
            Algorithm::BucketedWindow {
                limit,
                window_ms,
                bucket_ms,
            } => {
                amount("limit", limit)?;
                check_buckets(rule, window_ms, bucket_ms)?;
            }
            Algorithm::Concurrency { limit, lease_ms } => check_leases(rule, limit, lease_ms)?,
            Algorithm::Quota {
                limit,
                period,
                start_day,
                start_month,
                ..
            } => {
                amount("limit", limit)?;
                check_quota_start(rule, period, start_day, start_month)?;
            }
        }
        Ok(())
    }
}

/// The name errors give the field `name` of rule number `rule`: `rules[<rule>].<name>`.
fn field(rule: usize, name: &str) -> String {
    format!("rules[{rule}].{name}")
}

/// Checks that `v`, the field `name` of rule `rule`, is an amount: 1 to [`MAX_AMOUNT`].
fn check_amount(rule: usize, name: &str, v: u64) -> Result<(), PolicyError> {
    if v == 0 || v > MAX_AMOUNT {
        return Err(PolicyError::field(
            field(rule, name),
            format!("must be between 1 and {MAX_AMOUNT}"),
        ));
    }
    Ok(())
}

/// Checks that `v`, the field `name` of rule `rule`, is a period: 1 to [`MAX_PERIOD_MS`]
/// milliseconds.
fn check_period(rule: usize, name: &str, v: u64) -> Result<(), PolicyError> {
    if v == 0 || v > MAX_PERIOD_MS {
        return Err(PolicyError::field(
            field(rule, name),
            format!("must be between 1 and {MAX_PERIOD_MS} milliseconds"),
        ));
    }
    Ok(())
}

/// Checks a bucketed window's periods: both in range, and the window a whole number of
/// buckets, at most [`MAX_BUCKETS`].
fn check_buckets(rule: usize, window_ms: u64, bucket_ms: u64) -> Result<(), PolicyError> {
    check_period(rule, "window_ms", window_ms)?;
    check_period(rule, "bucket_ms", bucket_ms)?;
    if !window_ms.is_multiple_of(bucket_ms) {
        return Err(PolicyError::field(
            field(rule, "bucket_ms"),
            "must divide window_ms exactly",
        ));
    }
    if window_ms / bucket_ms > MAX_BUCKETS {
        return Err(PolicyError::field(
            field(rule, "bucket_ms"),
            format!("window_ms / bucket_ms must be at most {MAX_BUCKETS}"),
        ));
    }
    Ok(())
}

/// Checks a concurrency rule's leases: at most [`MAX_LEASES`] at once, each held at most
/// [`MAX_LEASE_MS`].
fn check_leases(rule: usize, limit: u64, lease_ms: u64) -> Result<(), PolicyError> {
    if limit == 0 || limit > MAX_LEASES {
        return Err(PolicyError::field(
            field(rule, "limit"),
            format!("must be between 1 and {MAX_LEASES} (each lease is kept in Redis)"),
        ));
    }
    if lease_ms == 0 || lease_ms > MAX_LEASE_MS {
        return Err(PolicyError::field(
            field(rule, "lease_ms"),
            format!(
                "must be between 1 and {MAX_LEASE_MS} milliseconds (a day); renew longer leases"
            ),
        ));
    }
    Ok(())
}

/// Checks where a quota's periods start: `start_day` a day its `period` has (none for a
/// daily quota), `start_month` a month and only for a yearly one (0: not given).
fn check_quota_start(
    rule: usize,
    period: Period,
    start_day: u8,
    start_month: u8,
) -> Result<(), PolicyError> {
    let days = match period {
        Period::Day => 0,
        Period::Week => 7,
        Period::Month | Period::Year => 31,
    };
    if start_day > days {
        return Err(PolicyError::field(
            field(rule, "start_day"),
            match period {
                Period::Day => {
                    "a daily quota starts every day at midnight: leave start_day out".to_owned()
                }
                Period::Week => "must be an ISO weekday: 1 (Monday) to 7 (Sunday)".to_owned(),
                _ => {
                    "must be a day of the month, 1 to 31 (the month's last day when it is shorter)"
                        .to_owned()
                }
            },
        ));
    }
    if start_month > 12 || (start_month > 0 && period != Period::Year) {
        return Err(PolicyError::field(
            field(rule, "start_month"),
            if period == Period::Year {
                "must be a month, 1 to 12"
            } else {
                "only a yearly quota has a start_month"
            },
        ));
    }
    Ok(())
}

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

/// One limit of a policy. Built only through [`Rule::new`], so it has no `Deserialize`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rule {
    pub name: Name,
    #[serde(flatten)]
    pub algorithm: Algorithm,
    /// Dimensions this rule counts; `None` means every dimension of the check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<Vec<Name>>,
    /// Whether denied requests count too.
    #[serde(default)]
    pub count_denied: bool,
    /// How it counts a check's cost; `None`: its algorithm's default ([`Rule::cost_model`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CostModel>,
    /// The penalty box: once this rule denies an identifier, it stays denied for this long
    /// (ms) from that moment, whatever the rule's own state says. `None`: no penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_ms: Option<u64>,
    /// Limits sent with the request: the most a caller may set each of this rule's numbers
    /// to for one check (`"limits": {"<rule>": {"limit": 500}}`), by parameter field.
    /// `None`: callers may set none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller_max: Option<std::collections::BTreeMap<String, u64>>,
    /// Where its checks are decided: in Redis (`exact`, the default) or on each instance
    /// (`local`), flushed every `flush_ms`.
    #[serde(default, skip_serializing_if = "SyncMode::is_exact")]
    pub sync: SyncMode,
    /// A local rule's flush period, ms; `None`: [`DEFAULT_FLUSH_MS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_ms: Option<u64>,
    /// Whether it is an override's own rule: counted in a key space of its own, so it never
    /// shares a counter with a policy rule of the same name (`store::keys`).
    #[serde(skip)]
    pub of_override: bool,
}

impl Rule {
    /// Builds a rule, checking every parameter; `index` is its place in the policy.
    pub fn new(
        index: usize,
        name: &str,
        algorithm: Algorithm,
        dimensions: Option<Vec<String>>,
        count_denied: bool,
    ) -> Result<Self, PolicyError> {
        let name =
            Name::parse(name).map_err(|m| PolicyError::field(format!("rules[{index}].name"), m))?;
        algorithm.validate(index)?;
        if count_denied && matches!(algorithm, Algorithm::Concurrency { .. }) {
            return Err(PolicyError::field(
                format!("rules[{index}].count_denied"),
                "a concurrency rule holds leases for allowed requests only",
            ));
        }
        let dimensions = match dimensions {
            None => None,
            Some(dims) if dims.is_empty() => {
                return Err(PolicyError::field(
                    format!("rules[{index}].dimensions"),
                    "must name at least one dimension, or be left out for all",
                ));
            }
            Some(dims) => Some(
                dims.iter()
                    .enumerate()
                    .map(|(j, d)| {
                        Name::parse(d).map_err(|m| {
                            PolicyError::field(format!("rules[{index}].dimensions[{j}]"), m)
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        Ok(Self {
            name,
            algorithm,
            dimensions,
            count_denied,
            cost: None,
            block_ms: None,
            caller_max: None,
            sync: SyncMode::Exact,
            flush_ms: None,
            of_override: false,
        })
    }

    /// This rule with the numbers a caller sent for one check (`numbers`, by parameter
    /// field), each within the rule's `caller_max`; `at` names the request's field
    /// (`limits.per-customer`). The rule keeps its name, dimensions and penalty.
    pub fn with_caller_numbers(
        &self,
        numbers: &std::collections::BTreeMap<String, u64>,
        at: &str,
    ) -> Result<Rule, PolicyError> {
        let Some(caps) = &self.caller_max else {
            return Err(PolicyError::field(
                at,
                format!(
                    "rule {} takes no limits from callers (its policy gives it no caller_max)",
                    self.name
                ),
            ));
        };
        let kind = self.algorithm.kind();
        let mut values: Vec<u64> = self.algorithm.params()[..kind.params.len()].to_vec();
        for (field, &value) in numbers {
            let Some(&cap) = caps.get(field) else {
                let allowed: Vec<&str> = caps.keys().map(String::as_str).collect();
                return Err(PolicyError::field(
                    format!("{at}.{field}"),
                    format!(
                        "rule {} lets callers set only {}",
                        self.name,
                        allowed.join(", ")
                    ),
                ));
            };
            if value == 0 || value > cap {
                return Err(PolicyError::field(
                    format!("{at}.{field}"),
                    format!("must be from 1 to {cap} (rule {}'s caller_max)", self.name),
                ));
            }
            let i = kind
                .params
                .iter()
                .position(|p| p.field == field)
                .expect("caller_max names only the rule's parameters");
            values[i] = value;
        }
        let mut algorithm = kind.with(&values).expect("one value per parameter");
        // A quota keeps its calendar.
        if let (
            Algorithm::Quota { limit, .. },
            Algorithm::Quota {
                period,
                time_zone,
                start_day,
                start_month,
                ..
            },
        ) = (algorithm, self.algorithm)
        {
            algorithm = Algorithm::Quota {
                limit,
                period,
                time_zone,
                start_day,
                start_month,
            };
        }
        algorithm.validate(0).map_err(|e| {
            let field = e.field.rsplit_once('.').map_or("", |(_, f)| f).to_owned();
            PolicyError::field(format!("{at}.{field}"), e.message)
        })?;
        Ok(Rule {
            algorithm,
            ..self.clone()
        })
    }

    /// A local rule's flush period (ms); `None` for an exact rule.
    pub fn local_flush_ms(&self) -> Option<u64> {
        (self.sync == SyncMode::Local).then(|| self.flush_ms.unwrap_or(DEFAULT_FLUSH_MS))
    }

    /// Whether local counting has a meaning for `algorithm`: one number of what is left that
    /// instances can spend apart and add up later. A sliding log keeps each admission's time,
    /// a concurrency rule leases, and a leaky bucket answers a place in its queue.
    pub fn counts_locally(algorithm: &Algorithm) -> bool {
        !matches!(
            algorithm,
            Algorithm::SlidingLog { .. }
                | Algorithm::Concurrency { .. }
                | Algorithm::LeakyBucket { .. }
        )
    }

    /// How this rule counts a check's cost: as it says, else requests for a concurrency
    /// rule (a lease per request in flight) and the check's cost for every other.
    pub fn cost_model(&self) -> CostModel {
        self.cost.unwrap_or(match self.algorithm {
            Algorithm::Concurrency { .. } => CostModel::Request,
            _ => CostModel::Units,
        })
    }

    /// What a check of `cost` counts against this rule.
    pub fn cost_of(&self, cost: u64) -> u64 {
        self.cost_model().of(cost)
    }

    /// Whether this rule counts identifiers of `dimension`.
    pub fn applies_to(&self, dimension: &str) -> bool {
        self.dimensions
            .as_ref()
            .is_none_or(|dims| dims.iter().any(|d| d.as_str() == dimension))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table, the enum and its parameters agree: every kind builds an algorithm of its
    /// own name whose parameters read back in the table's order, and names and codes are
    /// unique.
    #[test]
    fn the_algorithm_table_matches_the_enum() {
        for (i, kind) in ALGORITHMS.iter().enumerate() {
            let values: Vec<u64> = (1..=kind.params.len() as u64).map(|v| v * 10).collect();
            let algorithm = kind.with(&values).unwrap();
            assert_eq!(algorithm.kind(), kind);
            assert_eq!(kind.code.len(), 2, "codes end every state key");
            assert_eq!(&algorithm.params()[..values.len()], &values[..]);
            assert!(
                kind.with(&values[..values.len() - 1]).is_none(),
                "{}",
                kind.name
            );
            for other in &ALGORITHMS[i + 1..] {
                assert_ne!(kind.name, other.name);
                assert_ne!(kind.code, other.code);
            }
        }
    }
}
