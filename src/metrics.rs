//! Prometheus metrics. Labels are policy names and outcomes, never identifiers: the number
//! of series stays bounded by the number of policies.

use std::{
    collections::HashMap,
    sync::{OnceLock, RwLock},
};

use metrics::{Counter, Histogram};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Check latency buckets, seconds: Spillway answers in well under a millisecond.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// The process-wide recorder, installed on first use.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("duration_seconds".into()), LATENCY_BUCKETS)
            .expect("valid buckets")
            .build_recorder();
        let handle = recorder.handle();
        // Another recorder may exist already (tests embedding the app); then keep ours
        // detached, and /metrics renders only what reached it.
        let _ = metrics::set_global_recorder(recorder);
        handle
    })
}

/// Drains the histograms' pending samples into their buckets every few seconds. Without
/// it the recorder keeps every sample until /metrics is scraped: memory grows with each
/// check and every check gets slower.
pub fn spawn_upkeep(shutdown: &crate::shutdown::Shutdown) {
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

/// Counts a check answered from the over-limit cache, without Redis.
pub fn deny_cache_hit() {
    cached!(Counter, metrics::counter!("spillway_deny_cache_hits_total")).increment(1);
}

/// Counts the hits of one Envoy descriptor that found a limit, under its metric key (as
/// envoyproxy/ratelimit names its statistics: `domain.key_value.key`), by what it answered:
/// `within_limit`, `over_limit` or `shadow_mode` (over a shadow-mode limit, answered OK).
pub fn envoy_hits(key: &str, status: &'static str, hits: u64) {
    metrics::counter!("spillway_envoy_hits_total", "key" => key.to_owned(), "status" => status)
        .increment(hits);
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
