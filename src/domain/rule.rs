//! Rules and their algorithms, parsed from the policy document's JSON (docs/services.md, "The API").
//! Once a `Rule` exists its parameters are valid: every check below names the field.

use serde::{Deserialize, Serialize};

mod algorithm;
mod cost;

pub use cost::{CostModel, MAX_WEIGHT};

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
