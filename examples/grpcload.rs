//! Closed-loop load on Envoy's rate limit service for `make bench`: `streams` callers, each
//! sending its next `ShouldRateLimit` as soon as the last is answered, multiplexed over
//! `connections` HTTP/2 connections (as Envoy does), each request for a random one of
//! `users` descriptor values, on one thread.
//!
//! `grpcload <host:port> <seconds> <connections> <streams> <users> <domain> <service key>`
//! prints one line: `requests=N rps=R p50_ms=A p99_ms=B ok=O over=V errors=E`.

use std::{
    cell::RefCell,
    rc::Rc,
    time::{Duration, Instant},
};

use envoy_types::pb::envoy::{
    extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry},
    service::ratelimit::v3::{
        RateLimitRequest, rate_limit_response::Code,
        rate_limit_service_client::RateLimitServiceClient,
    },
};

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    ok: u64,
    over: u64,
    errors: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 7 {
        eprintln!(
            "usage: grpcload <host:port> <seconds> <connections> <streams> <users> <domain> <service key>"
        );
        std::process::exit(2);
    }
    let n = |i: usize| -> u64 { args[i].parse().expect("a whole number") };
    let (addr, seconds, connections, streams, users) = (args[0].clone(), n(1), n(2), n(3), n(4));
    let (domain, key) = (args[5].clone(), args[6].clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    let tally = Rc::new(RefCell::new(Tally::default()));
    let started = Instant::now();
    local.block_on(&runtime, async {
        let mut channels = Vec::new();
        for _ in 0..connections {
            let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .expect("connects");
            channels.push(channel);
        }
        let until = Instant::now() + Duration::from_secs(seconds);
        let mut tasks = Vec::new();
        for s in 0..streams {
            let mut client =
                RateLimitServiceClient::new(channels[(s % connections) as usize].clone());
            let (tally, domain, key) = (tally.clone(), domain.clone(), key.clone());
            tasks.push(tokio::task::spawn_local(async move {
                // A small xorshift per caller: random users without a shared generator.
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (s + 1);
                while Instant::now() < until {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let mut request = tonic::Request::new(RateLimitRequest {
                        domain: domain.clone(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![Entry {
                                key: "user".into(),
                                value: (x % users).to_string(),
                            }],
                            ..Default::default()
                        }],
                        hits_addend: 1,
                    });
                    request
                        .metadata_mut()
                        .insert("authorization", format!("Bearer {key}").parse().unwrap());
                    let sent = Instant::now();
                    let answer = client.should_rate_limit(request).await;
                    let mut t = tally.borrow_mut();
                    t.latencies_us.push(sent.elapsed().as_micros() as u64);
                    match answer {
                        Ok(r) if r.get_ref().overall_code == Code::Ok as i32 => t.ok += 1,
                        Ok(_) => t.over += 1,
                        Err(_) => t.errors += 1,
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    let mut t = tally.borrow_mut();
    t.latencies_us.sort_unstable();
    let pct = |p: f64| -> f64 {
        let l = &t.latencies_us;
        if l.is_empty() {
            return 0.0;
        }
        l[((l.len() as f64 * p) as usize).min(l.len() - 1)] as f64 / 1000.0
    };
    println!(
        "requests={} rps={:.0} p50_ms={:.3} p99_ms={:.3} ok={} over={} errors={}",
        t.latencies_us.len(),
        t.latencies_us.len() as f64 / elapsed,
        pct(0.50),
        pct(0.99),
        t.ok,
        t.over,
        t.errors
    );
}
