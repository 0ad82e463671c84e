//! Redis memory per tracked identifier for every algorithm: a measurement, run on demand
//! (`cargo test --features ssr --test it -- --ignored --nocapture memory`), not a pass/fail
//! test. It prints a markdown table.

use std::time::Duration;

use spillway::{
    domain::{Algorithm, Identifier, Name, Rule},
    store::{CheckEntry, Keys, Now, Store},
};

use crate::helpers::RedisServer;

const LONG_MS: u64 = 400 * 24 * 3600 * 1000;

fn used_memory(conn: &mut redis::Connection) -> i64 {
    let info: String = redis::cmd("INFO").arg("memory").query(conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

async fn fill(store: &Store, algorithm: Algorithm, identifiers: usize, checks_each: usize) {
    let policy = Name::parse("api").unwrap();
    let rule = Rule::new(0, "per-minute", algorithm, None, false).unwrap();
    let rule = std::sync::Arc::new(rule);
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..32 {
        let (store, policy, rule) = (store.clone(), policy.clone(), rule.clone());
        tasks.spawn(async move {
            for i in (worker..identifiers).step_by(32) {
                let id = Identifier::new("user", &(100_000_000 + i).to_string()).unwrap();
                for _ in 0..checks_each {
                    let entry = CheckEntry::new(&rule, &id);
                    store
                        .check_and_consume(&policy, &[entry], 1, Now::Redis)
                        .await
                        .unwrap();
                }
            }
        });
    }
    while let Some(t) = tasks.join_next().await {
        t.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run on demand"]
async fn memory_per_identifier() {
    let redis = RedisServer::start();
    let store = Store::connect_with_keys(&redis.url(), Duration::from_secs(30), Keys::default())
        .await
        .unwrap();
    let mut conn = redis.connection();
    let n = 100_000;
    let algorithms = [
        Algorithm::FixedWindow {
            limit: 100,
            window_ms: LONG_MS,
        },
        Algorithm::SlidingWindow {
            limit: 100,
            window_ms: LONG_MS,
        },
        Algorithm::TokenBucket {
            capacity: 100,
            refill_tokens: 1,
            refill_period_ms: LONG_MS,
        },
        Algorithm::LeakyBucket {
            capacity: 100,
            leak_tokens: 1,
            leak_period_ms: LONG_MS,
        },
        Algorithm::Gcra {
            rate: 1,
            period_ms: LONG_MS,
            burst: 99,
        },
        Algorithm::BucketedWindow {
            limit: 100,
            window_ms: LONG_MS,
            bucket_ms: LONG_MS / 60,
        },
        Algorithm::SlidingLog {
            limit: 1000,
            window_ms: LONG_MS,
        },
        // One lease held per identifier (a day long).
        Algorithm::Concurrency {
            limit: 100,
            lease_ms: spillway::domain::rule::MAX_LEASE_MS,
        },
        Algorithm::Quota {
            limit: 100,
            period: spillway::domain::calendar::Period::Month,
            time_zone: spillway::domain::calendar::ZoneName::new("Europe/Berlin").unwrap(),
            start_day: 0,
            start_month: 0,
        },
    ];
    println!("\n| algorithm | bytes per identifier ({n} identifiers, 1 check each) |\n|---|---|");
    for algorithm in algorithms {
        redis::cmd("FLUSHALL").query::<()>(&mut conn).unwrap();
        let before = used_memory(&mut conn);
        fill(&store, algorithm, n, 1).await;
        let after = used_memory(&mut conn);
        println!("| {} | {} |", algorithm.name(), (after - before) / n as i64);
    }
    // Sliding log: the cost of each further entry, small (listpack) and large (skiplist) logs.
    for entries in [100usize, 300] {
        let ids = 1000;
        redis::cmd("FLUSHALL").query::<()>(&mut conn).unwrap();
        let base = used_memory(&mut conn);
        fill(
            &store,
            Algorithm::SlidingLog {
                limit: 1000,
                window_ms: LONG_MS,
            },
            ids,
            1,
        )
        .await;
        let one = used_memory(&mut conn);
        fill(
            &store,
            Algorithm::SlidingLog {
                limit: 1000,
                window_ms: LONG_MS,
            },
            ids,
            entries - 1,
        )
        .await;
        let many = used_memory(&mut conn);
        println!(
            "| sliding_log, per entry at {entries} entries | {} (first entry with its key: {}) |",
            (many - one) / (ids * (entries - 1)) as i64,
            (one - base) / ids as i64
        );
    }
}

/// Redis memory of one busy policy's history for one day: every minute with all four
/// counts, every hour's top lists full (64 checked, 64 denied), its share of the lists of
/// every policy together, and the day's lists. Run on demand like the table above.
#[tokio::test]
#[ignore = "a measurement: run on demand"]
async fn history_memory_per_policy_per_day() {
    use spillway::{domain::history::Counts, store::history::HistoryBatch};
    let redis = RedisServer::start();
    let store = Store::connect_with_keys(&redis.url(), Duration::from_secs(10), Keys::default())
        .await
        .unwrap();
    let mut conn = redis.connection();
    let before = used_memory(&mut conn);
    // A recent day, so nothing is past its retention.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let first_hour = now_ms / 3_600_000 - 24;
    let counts = Counts {
        allowed: 123_456,
        denied: 7_890,
        shadow_denied: 12,
        degraded: 3,
        unmatched: 0,
    };
    for hour in first_hour..first_hour + 24 {
        // 300 identifiers an hour, a new set each hour: every list is full.
        let top = (0..300)
            .map(|i| {
                (
                    format!("user=customer-{hour}-{i:04}"),
                    1000 - i as u64,
                    500 - i as u64,
                )
            })
            .collect();
        store
            .add_history(&HistoryBatch {
                counts: (0..60)
                    .map(|m| ("busy-policy".to_owned(), hour * 60 + m, counts))
                    .collect(),
                top: vec![("busy-policy".to_owned(), hour, top)],
            })
            .await
            .unwrap();
    }
    let after = used_memory(&mut conn);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("spw:hist:*")
        .query(&mut conn)
        .unwrap();
    let mut by_kind = std::collections::BTreeMap::<String, (usize, i64)>::new();
    for k in &keys {
        let bytes: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(k)
            .query(&mut conn)
            .unwrap();
        let kind = if k.contains(":top:") {
            format!(
                "top lists ({})",
                if k.contains("{*}") {
                    "every policy"
                } else {
                    "policy"
                }
            )
        } else {
            format!(
                "counts ({})",
                if k.contains("{*}") {
                    "every policy"
                } else {
                    "policy"
                }
            )
        };
        let e = by_kind.entry(kind).or_default();
        e.0 += 1;
        e.1 += bytes;
    }
    println!("| history of one busy policy, one day | keys | bytes (MEMORY USAGE) |");
    println!("|---|---|---|");
    for (kind, (n, bytes)) in &by_kind {
        println!("| {kind} | {n} | {bytes} |");
    }
    println!(
        "used_memory grew by {} bytes for {} keys",
        after - before,
        keys.len()
    );
}

/// What the largest concurrency rule costs Redis: 100,000 leases of one identifier, then
/// denied checks whose retry walks every lease (cost = limit, the most a walk can pass) and
/// allowed-size peeks. Prints the median of each (a measurement, run on demand).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run on demand"]
async fn a_full_concurrency_rule_of_100k_leases() {
    use spillway::domain::rule::{MAX_LEASE_MS, MAX_LEASES};
    let redis = RedisServer::start();
    let store = Store::connect_with_keys(&redis.url(), Duration::from_secs(30), Keys::default())
        .await
        .unwrap();
    let algorithm = Algorithm::Concurrency {
        limit: MAX_LEASES,
        lease_ms: MAX_LEASE_MS,
    };
    fill(&store, algorithm, 1, MAX_LEASES as usize).await;
    let policy = Name::parse("api").unwrap();
    let rule = Rule::new(0, "per-minute", algorithm, None, false).unwrap();
    let id = Identifier::new("user", "100000000").unwrap();
    let entry = [CheckEntry::new(&rule, &id)];
    let timings = |cost: u64| {
        let (store, policy, entry) = (&store, &policy, &entry);
        async move {
            let mut us = Vec::new();
            for _ in 0..21 {
                let started = std::time::Instant::now();
                let d = store
                    .check_and_consume(policy, entry, cost, Now::Redis)
                    .await
                    .unwrap();
                us.push(started.elapsed().as_micros());
                assert!(!d.allowed);
            }
            us.sort();
            us[us.len() / 2]
        }
    };
    let one = timings(1).await;
    let all = timings(MAX_LEASES).await;
    println!(
        "\n100,000 leases held: a denied check of cost 1 {one} µs, of cost 100,000 (its retry walks every lease) {all} µs (medians of 21, round trip included)"
    );
}
