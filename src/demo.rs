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

/// One caller: `per_second` checks a second for `user` from `ip`.
fn caller(
    client: reqwest::Client,
    url: String,
    key: String,
    user: String,
    ip: String,
    per_second: f64,
    tally: Arc<Tally>,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            check(&client, &url, &key, &user, &ip, &tally).await;
        }
    });
}

/// Drives the traffic; prints a line every 5 seconds.
pub async fn run(options: DemoOptions, service_key: String) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .pool_max_idle_per_host(64)
        .build()?;
    let url = format!("{}/api/v1/check", options.url.trim_end_matches('/'));
    let tally = Arc::new(Tally::default());
    for (i, name) in ["alice", "bob", "carol"].iter().enumerate() {
        caller(
            client.clone(),
            url.clone(),
            service_key.clone(),
            (*name).into(),
            format!("203.0.113.{}", 10 + i),
            8.5,
            tally.clone(),
        );
    }
    // Light users: 200 of them, one check every 20 s each (10 a second in all), spread out.
    {
        let (client, url, key, tally) = (
            client.clone(),
            url.clone(),
            service_key.clone(),
            tally.clone(),
        );
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
    caller(
        client.clone(),
        url.clone(),
        service_key.clone(),
        "scraper".into(),
        "192.0.2.66".into(),
        40.0,
        tally.clone(),
    );
    println!(
        "demo: sending about 75 checks a second to {url}: alice, bob and carol near their limit, 200 light users, and user=scraper throttled. Ctrl-C stops."
    );
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
                if options.seconds.is_some_and(|s| started.elapsed().as_secs() >= s) {
                    return Ok(());
                }
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}
