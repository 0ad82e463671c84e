//! `spillway demo`: realistic synthetic traffic through the check API against the demo
//! policy, so a newcomer sees the overview and the inspector move within seconds: three
//! heavy users near their limit, a couple of hundred light users, and one abuser who is
//! throttled all the time.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

/// Where to send traffic and for how long.
#[derive(Debug, PartialEq, Eq)]
pub struct DemoOptions {
    pub url: String,
    /// `None`: until Ctrl-C.
    pub seconds: Option<u64>,
}

#[derive(Default)]
struct Tally {
    allowed: AtomicU64,
    denied: AtomicU64,
    failed: AtomicU64,
}

async fn check(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    user: &str,
    ip: &str,
    tally: &Tally,
) {
    let body = serde_json::json!({ "policy": "demo", "identifiers": { "user": user, "ip": ip } });
    match client.post(url).bearer_auth(key).json(&body).send().await {
        Ok(r) if r.status().is_success() => tally.allowed.fetch_add(1, Ordering::Relaxed),
        Ok(r) if r.status().as_u16() == 429 => tally.denied.fetch_add(1, Ordering::Relaxed),
        _ => tally.failed.fetch_add(1, Ordering::Relaxed),
    };
}

/// One caller: `burst` checks back to back for `user` from `ip`, every `every`.
struct Caller {
    user: String,
    ip: String,
    burst: u32,
    every: Duration,
    /// Delay before the first burst, so callers do not move in step.
    start: Duration,
}

fn spawn_caller(client: reqwest::Client, url: String, key: String, c: Caller, tally: Arc<Tally>) {
    tokio::spawn(async move {
        tokio::time::sleep(c.start).await;
        let mut tick = tokio::time::interval(c.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for _ in 0..c.burst {
                check(&client, &url, &key, &c.user, &c.ip, &tally).await;
            }
        }
    });
}

/// Drives the traffic; prints a line every 5 seconds.
pub async fn run(options: DemoOptions, service_key: String) -> anyhow::Result<()> {
    crate::install_tls_provider();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .pool_max_idle_per_host(64)
        .build()?;
    let url = format!("{}/api/v1/check", options.url.trim_end_matches('/'));
    let tally = Arc::new(Tally::default());
    // Heavy users: 9 at once every 6 s, 90 % of the demo's 10 per second, 90 of its 120
    // per minute: near their limit, never over it.
    for (i, name) in ["alice", "bob", "carol"].iter().enumerate() {
        spawn_caller(
            client.clone(),
            url.clone(),
            service_key.clone(),
            Caller {
                user: (*name).into(),
                ip: format!("203.0.113.{}", 10 + i),
                burst: 9,
                every: Duration::from_secs(6),
                start: Duration::from_millis(1500 * i as u64),
            },
            tally.clone(),
        );
    }
    spawn_light_users(
        client.clone(),
        url.clone(),
        service_key.clone(),
        tally.clone(),
    );
    // The abuser: 40 a second, from one address.
    spawn_caller(
        client.clone(),
        url.clone(),
        service_key.clone(),
        Caller {
            user: "scraper".into(),
            ip: "192.0.2.66".into(),
            burst: 1,
            every: Duration::from_millis(25),
            start: Duration::ZERO,
        },
        tally.clone(),
    );
    println!(
        "demo: sending about 55 checks a second to {url}: alice, bob and carol near their limit, 200 light users, and a scraper (user=scraper, ip=192.0.2.66) throttled. Ctrl-C stops."
    );
    print_tally(&tally, options.seconds).await;
    Ok(())
}

/// Light users: 200 of them, one check every 20 s each (10 a second in all), spread out.
fn spawn_light_users(client: reqwest::Client, url: String, key: String, tally: Arc<Tally>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut n: u64 = 0;
        loop {
            tick.tick().await;
            n = n
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let user = 1000 + (n >> 33) % 200;
            let ip = format!("198.51.100.{}", 1 + user % 60);
            check(&client, &url, &key, &format!("u{user}"), &ip, &tally).await;
        }
    });
}

/// Prints what `tally` counted every 5 seconds; returns once `seconds` have passed (never,
/// when `None`) or on Ctrl-C.
async fn print_tally(tally: &Tally, seconds: Option<u64>) {
    let started = std::time::Instant::now();
    let mut report = tokio::time::interval(Duration::from_secs(5));
    report.tick().await;
    loop {
        tokio::select! {
            _ = report.tick() => {
                println!(
                    "demo: {:>4} s  allowed {:>6}  denied {:>6}  failed {:>4}",
                    started.elapsed().as_secs(),
                    tally.allowed.load(Ordering::Relaxed),
                    tally.denied.load(Ordering::Relaxed),
                    tally.failed.load(Ordering::Relaxed)
                );
                if seconds.is_some_and(|s| started.elapsed().as_secs() >= s) {
                    return;
                }
            }
            _ = tokio::signal::ctrl_c() => return,
        }
    }
}
