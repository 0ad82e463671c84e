//! Prometheus metrics. Labels are policy names and outcomes, never identifiers: the number
//! of series stays bounded by the number of policies.

use std::{
    collections::HashMap,
    sync::{OnceLock, RwLock},
};

use metrics::{Counter, Histogram, Unit};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Check latency buckets, seconds: Spillway answers in well under a millisecond.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Checks per Redis call of the coalescer: one alone, up to its batches' size.
const PER_CALL_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// The share of a rule's limit used past which an allowed check counts as near the limit
/// (envoyproxy/ratelimit's default near-limit ratio).
const NEAR_LIMIT: f64 = 0.8;

/// The process-wide recorder, installed on first use.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("duration_seconds".into()), LATENCY_BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("spillway_redis_checks_per_call".into()),
                    PER_CALL_BUCKETS,
                )
            })
            .expect("valid buckets")
            .build_recorder();
        let handle = recorder.handle();
        // Another recorder may exist already (tests embedding the app); then keep ours
        // detached, and /metrics renders only what reached it.
        if metrics::set_global_recorder(recorder).is_ok() {
            describe();
        }
        handle
    })
}

/// The Prometheus text of every series, with the process's own (`process_resident_memory_bytes`,
/// `process_cpu_seconds_total`, threads, file descriptors) read now.
pub fn render() -> String {
    static PROCESS: OnceLock<metrics_process::Collector> = OnceLock::new();
    let handle = handle();
    PROCESS
        .get_or_init(|| {
            let collector = metrics_process::Collector::default();
            collector.describe();
            collector
        })
        .collect();
    handle.render()
}

/// What a series is, for its `# TYPE` line.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
    /// A histogram of durations in seconds.
    Seconds,
}

/// Every series this instance exports, with its `# HELP` line.
const SERIES: &[(Kind, &str, &str)] = &[
    (
        Kind::Counter,
        "spillway_checks_total",
        "Checks answered, by policy and outcome (allowed, denied, shadow_denied, degraded, unavailable, unmatched)",
    ),
    (
        Kind::Seconds,
        "spillway_check_duration_seconds",
        "Time to answer a check, by policy",
    ),
    (
        Kind::Counter,
        "spillway_rule_checks_total",
        "Rule verdicts by policy, rule and decision (allowed, near_limit, denied); only with SPILLWAY_METRICS_RULE_LABEL=true",
    ),
    (
        Kind::Counter,
        "spillway_waits_total",
        "Denied requests held by policies that wait (on_deny: wait), by policy and how the wait ended (passed; too_long: past max_wait_ms or the caller's deadline; full: SPILLWAY_MAX_WAITING; never: no wait admits it)",
    ),
    (
        Kind::Counter,
        "spillway_near_limit_total",
        "Allowed checks that left a rule more than 80% used, by policy",
    ),
    (
        Kind::Counter,
        "spillway_unused_dimensions_total",
        "Checks that sent a dimension no rule of their policy counts (a misspelt name, say), by policy",
    ),
    (
        Kind::Counter,
        "spillway_check_timeouts_total",
        "Checks that timed out waiting for Redis, by stage (queued: never applied; sent: Redis may still apply it)",
    ),
    (
        Kind::Seconds,
        "spillway_redis_duration_seconds",
        "Time of a Redis call on the check path",
    ),
    (
        Kind::Histogram,
        "spillway_redis_checks_per_call",
        "Checks carried by one call of the check script (the coalescer's batches)",
    ),
    (
        Kind::Counter,
        "spillway_redis_errors_total",
        "Redis calls on the check path that failed",
    ),
    (
        Kind::Gauge,
        "spillway_redis_breaker_open",
        "1 while the Redis circuit breaker is open (calls fail fast), 0 otherwise",
    ),
    (
        Kind::Gauge,
        "spillway_redis_up",
        "1 while Redis answers (the last health probe or check reached it), 0 during an outage",
    ),
    (
        Kind::Counter,
        "spillway_trace_exports_failed_total",
        "Batches of spans the OTLP collector did not take (their spans are lost)",
    ),
    (
        Kind::Counter,
        "spillway_calls_refused_total",
        "Calls refused at once because a port's budget was spent, by reason (pending: calls begun and not yet read, SPILLWAY_MAX_PENDING_CALLS)",
    ),
    (
        Kind::Counter,
        "spillway_policy_cache_lookups_total",
        "Policy lookups on the check path, by result (hit, miss)",
    ),
    (
        Kind::Counter,
        "spillway_deny_cache_hits_total",
        "Checks answered from the over-limit cache, without Redis",
    ),
    (
        Kind::Gauge,
        "spillway_deny_cache_entries",
        "Entries in the over-limit cache",
    ),
    (
        Kind::Gauge,
        "spillway_local_counters",
        "Counters of local rules (sync: local) this instance holds",
    ),
    (
        Kind::Counter,
        "spillway_local_checks_total",
        "Checks of policies with local rules answered by this instance's counters",
    ),
    (
        Kind::Counter,
        "spillway_envoy_hits_total",
        "Hits of Envoy descriptors that found a limit, by metric key and status (within_limit, over_limit, shadow_mode)",
    ),
    (
        Kind::Counter,
        "spillway_envoy_global_shadow_total",
        "Envoy requests over their limits answered OK because every request is in shadow mode (SPILLWAY_ENVOY_SHADOW_MODE)",
    ),
    (
        Kind::Counter,
        "spillway_leases_released_total",
        "Leases of concurrency rules released before they ran out",
    ),
    (
        Kind::Counter,
        "spillway_reports_total",
        "Usage reports, by policy and direction (added, given_back)",
    ),
    (
        Kind::Counter,
        "spillway_reported_cost_total",
        "Cost added or given back by usage reports, by policy and direction",
    ),
    (
        Kind::Gauge,
        "spillway_build_info",
        "1, labelled with this instance's version: count() of it is the instances up",
    ),
];

/// The `# HELP` line of every series, and the series every instance shows from its start.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    for &(kind, name, help) in SERIES {
        match kind {
            Kind::Counter => describe_counter!(name, help),
            Kind::Gauge => describe_gauge!(name, help),
            Kind::Histogram => describe_histogram!(name, help),
            Kind::Seconds => describe_histogram!(name, Unit::Seconds, help),
        }
    }
    metrics::gauge!("spillway_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    metrics::gauge!("spillway_redis_breaker_open").set(0.0);
    metrics::counter!("spillway_calls_refused_total", "reason" => "pending").increment(0);
    metrics::gauge!("spillway_deny_cache_entries").set(0.0);
    // Shown at 0 until the first one, so a board's rate() has a series from the start.
    metrics::counter!("spillway_redis_errors_total").increment(0);
    metrics::counter!("spillway_deny_cache_hits_total").increment(0);
}

/// Drains the histograms' pending samples into their buckets every few seconds. Without
/// it the recorder keeps every sample until /metrics is scraped: memory grows with each
/// check and every check gets slower.
pub fn spawn_upkeep(shutdown: &crate::support::shutdown::Shutdown) {
    let handle = handle();
    shutdown.spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    });
}

/// What became of a check: its `outcome` label.
const OUTCOMES: [&str; 5] = [
    "allowed",
    "denied",
    "shadow_denied",
    "degraded",
    "unavailable",
];

/// One policy's check metrics. The check path is hot: a handle found by the policy's name
/// spares building and hashing the labelled key in the recorder on every check.
struct PolicyMetrics {
    checks: [OnceLock<Counter>; OUTCOMES.len()],
    near_limit: OnceLock<Counter>,
    unused: OnceLock<Counter>,
    duration: Histogram,
}

fn with_policy(policy: &str, f: impl FnOnce(&PolicyMetrics)) {
    static POLICIES: OnceLock<RwLock<HashMap<String, PolicyMetrics>>> = OnceLock::new();
    let policies = POLICIES.get_or_init(|| {
        // Handles taken before the recorder is installed would record nowhere.
        handle();
        RwLock::default()
    });
    if let Some(m) = policies
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(policy)
    {
        return f(m);
    }
    let mut write = policies.write().unwrap_or_else(|e| e.into_inner());
    let m = write
        .entry(policy.to_owned())
        .or_insert_with(|| PolicyMetrics {
            checks: Default::default(),
            near_limit: OnceLock::new(),
            unused: OnceLock::new(),
            duration: metrics::histogram!(
                "spillway_check_duration_seconds",
                "policy" => policy.to_owned()
            ),
        });
    f(m)
}

/// Counts one check and its latency; `outcome` is one of `OUTCOMES`.
pub fn check_done(policy: &str, outcome: &'static str, seconds: f64) {
    with_policy(policy, |m| {
        let counter = || metrics::counter!("spillway_checks_total", "policy" => policy.to_owned(), "outcome" => outcome);
        match OUTCOMES.iter().position(|o| *o == outcome) {
            Some(i) => m.checks[i].get_or_init(counter).increment(1),
            None => counter().increment(1),
        }
        m.duration.record(seconds);
    });
}

/// A handle on an unlabelled (or fixed-label) metric, taken once the recorder is installed.
macro_rules! cached {
    ($kind:ident, $make:expr) => {{
        static HANDLE: OnceLock<$kind> = OnceLock::new();
        HANDLE.get_or_init(|| {
            handle();
            $make
        })
    }};
}

/// Counts one check that timed out waiting for Redis: `sent` when its call had gone out,
/// so Redis may still apply it (a fail-open answer then counted after all), or still
/// queued, so it was never applied.
pub fn check_timed_out(sent: bool) {
    let stage = if sent { "sent" } else { "queued" };
    metrics::counter!("spillway_check_timeouts_total", "stage" => stage).increment(1);
}

/// Counts one Redis call of the check path and its latency; `ok` false for errors.
pub fn redis_call(seconds: f64, ok: bool) {
    cached!(
        Histogram,
        metrics::histogram!("spillway_redis_duration_seconds")
    )
    .record(seconds);
    if !ok {
        cached!(Counter, metrics::counter!("spillway_redis_errors_total")).increment(1);
    }
}

/// Counts a policy lookup on the check path.
pub fn policy_lookup(hit: bool) {
    if hit {
        cached!(
            Counter,
            metrics::counter!("spillway_policy_cache_lookups_total", "result" => "hit")
        )
    } else {
        cached!(
            Counter,
            metrics::counter!("spillway_policy_cache_lookups_total", "result" => "miss")
        )
    }
    .increment(1);
}

/// Counts a check of `policy` that sent a dimension none of its rules counts.
pub fn unused_dimensions(policy: &str) {
    with_policy(policy, |m| {
        m.unused
            .get_or_init(|| {
                metrics::counter!("spillway_unused_dimensions_total", "policy" => policy.to_owned())
            })
            .increment(1);
    });
}

/// Counts what each rule of a decided check said: near the limit (an allowed check that left
/// a rule more than 80% used, per policy), and with `per_rule` every rule's verdict.
pub fn decided(policy: &str, results: &[crate::domain::RuleResult], per_rule: bool) {
    let near = |r: &crate::domain::RuleResult| {
        r.outcome.allowed
            && r.outcome.limit > 0
            && (r.outcome.limit - r.outcome.remaining.min(r.outcome.limit)) as f64
                > NEAR_LIMIT * r.outcome.limit as f64
    };
    if results.iter().any(near) {
        with_policy(policy, |m| {
            m.near_limit
                .get_or_init(|| {
                    metrics::counter!("spillway_near_limit_total", "policy" => policy.to_owned())
                })
                .increment(1);
        });
    }
    if per_rule {
        for r in results {
            let decision = match (r.outcome.allowed, near(r)) {
                (false, _) => "denied",
                (true, true) => "near_limit",
                (true, false) => "allowed",
            };
            metrics::counter!(
                "spillway_rule_checks_total",
                "policy" => policy.to_owned(),
                "rule" => r.rule.as_str().to_owned(),
                "decision" => decision
            )
            .increment(1);
        }
    }
}

/// Counts the checks one call of the check script carried.
pub fn checks_per_call(checks: usize) {
    cached!(
        Histogram,
        metrics::histogram!("spillway_redis_checks_per_call")
    )
    .record(checks as f64);
}

/// Whether the Redis circuit breaker is open.
pub fn breaker_open(open: bool) {
    metrics::gauge!("spillway_redis_breaker_open").set(if open { 1.0 } else { 0.0 });
}

/// The over-limit cache's size.
pub fn deny_cache_entries(entries: usize) {
    metrics::gauge!("spillway_deny_cache_entries").set(entries as f64);
}

/// How many counters of local rules this instance holds.
pub fn local_counters(counters: usize) {
    metrics::gauge!("spillway_local_counters").set(counters as f64);
}

/// Counts a check decided (in part) by this instance's counters of local rules.
pub fn local_check() {
    cached!(Counter, metrics::counter!("spillway_local_checks_total")).increment(1);
}

/// Counts a check answered from the over-limit cache, without Redis.
pub fn deny_cache_hit() {
    cached!(Counter, metrics::counter!("spillway_deny_cache_hits_total")).increment(1);
}

/// Counts the hits of one Envoy descriptor that found a limit, under its metric key (as
/// envoyproxy/ratelimit names its statistics: `domain.key_value.key`), by what it answered:
/// `within_limit`, `over_limit` or `shadow_mode` (over a shadow-mode limit, answered OK).
pub fn envoy_hits(key: &str, status: &'static str, hits: u64) {
    static KEYS: std::sync::OnceLock<MetricKeys> = std::sync::OnceLock::new();
    let key = KEYS
        .get_or_init(|| MetricKeys::new(MAX_ENVOY_METRIC_KEYS))
        .bounded(key);
    if UPSTREAM_NAMES.load(std::sync::atomic::Ordering::Relaxed) {
        upstream_hits(&key, status, hits);
    }
    metrics::counter!("spillway_envoy_hits_total", "key" => key, "status" => status)
        .increment(hits);
}

/// Whether Envoy hits are also counted under upstream's series (`SPILLWAY_METRICS_UPSTREAM_NAMES`).
static UPSTREAM_NAMES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Counts Envoy hits under envoyproxy/ratelimit's series too, from now on.
pub fn use_upstream_names() {
    UPSTREAM_NAMES.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The hits of one descriptor as envoyproxy/ratelimit's default statsd mapper names them
/// (what Envoy Gateway scrapes): `ratelimit_service_rate_limit_total_hits` and the status's
/// own series, labelled by the metric key's first three segments (`domain`, `key1`, `key2`;
/// deeper segments add into their parent's, as the mapper's rules drop them).
fn upstream_hits(key: &str, status: &'static str, hits: u64) {
    let mut segments = key.splitn(4, '.');
    let labels = [
        ("domain", segments.next().unwrap_or_default().to_owned()),
        ("key1", segments.next().unwrap_or_default().to_owned()),
        ("key2", segments.next().unwrap_or_default().to_owned()),
    ];
    metrics::counter!("ratelimit_service_rate_limit_total_hits", &labels).increment(hits);
    // Over a shadow-mode limit counts as over it too, as upstream counts it.
    let series: &[&'static str] = match status {
        "over_limit" => &["ratelimit_service_rate_limit_over_limit"],
        "shadow_mode" => &[
            "ratelimit_service_rate_limit_over_limit",
            "ratelimit_service_rate_limit_shadow_mode",
        ],
        _ => &["ratelimit_service_rate_limit_within_limit"],
    };
    for &name in series {
        metrics::counter!(name, &labels).increment(hits);
    }
}

/// Counts an Envoy request over its limits answered OK by `SPILLWAY_ENVOY_SHADOW_MODE`.
pub fn envoy_global_shadow() {
    cached!(
        Counter,
        metrics::counter!("spillway_envoy_global_shadow_total")
    )
    .increment(1);
}

/// The distinct `key` labels `spillway_envoy_hits_total` takes on one instance. A key of
/// `detailed_metric` or `value_to_metric` carries the request's values (a client address,
/// a user), so without a bound every caller would be a series.
pub const MAX_ENVOY_METRIC_KEYS: usize = 1000;

/// A bounded set of label values: the first `cap` distinct keys keep their own series;
/// later new ones are counted under their domain's `<domain>.other` (the key's first
/// segment).
pub struct MetricKeys {
    cap: usize,
    seen: std::sync::RwLock<std::collections::HashSet<String>>,
}

impl MetricKeys {
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            seen: std::sync::RwLock::default(),
        }
    }

    /// The label to count `key` under.
    pub fn bounded(&self, key: &str) -> String {
        if self
            .seen
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(key)
        {
            return key.to_owned();
        }
        let mut seen = self.seen.write().unwrap_or_else(|e| e.into_inner());
        if seen.len() < self.cap || seen.contains(key) {
            seen.insert(key.to_owned());
            return key.to_owned();
        }
        let domain = key.split('.').next().unwrap_or(key);
        format!("{domain}.other")
    }
}

/// Counts leases of concurrency rules released before they ran out.
pub fn leases_released(n: u64) {
    metrics::counter!("spillway_leases_released_total").increment(n);
}

/// Counts a usage report, and the cost it added or gave back.
pub fn reported(policy: &str, cost: i64) {
    let direction = if cost < 0 { "given_back" } else { "added" };
    metrics::counter!("spillway_reports_total", "policy" => policy.to_owned(), "direction" => direction)
        .increment(1);
    metrics::counter!("spillway_reported_cost_total", "policy" => policy.to_owned(), "direction" => direction)
        .increment(cost.unsigned_abs());
}

#[cfg(test)]
mod key_tests {
    #[test]
    fn detailed_keys_are_bounded_per_instance() {
        let keys = super::MetricKeys::new(3);
        assert_eq!(
            keys.bounded("edge.remote_address_1"),
            "edge.remote_address_1"
        );
        assert_eq!(
            keys.bounded("edge.remote_address_2"),
            "edge.remote_address_2"
        );
        assert_eq!(keys.bounded("edge.per_path"), "edge.per_path");
        assert_eq!(keys.bounded("edge.remote_address_4"), "edge.other");
        // Known keys keep their series.
        assert_eq!(
            keys.bounded("edge.remote_address_1"),
            "edge.remote_address_1"
        );
        let labels: std::collections::HashSet<String> = (0..5000)
            .map(|i| keys.bounded(&format!("edge.remote_address_{i}")))
            .collect();
        assert_eq!(labels.len(), 3, "{labels:?}");
    }
}
