//! Closed-loop load on Envoy's rate limit service for `make bench`: `streams` callers, each
//! sending its next `ShouldRateLimit` as soon as the last is answered, multiplexed over
//! `connections` HTTP/2 connections (as Envoy does), each request for a random one of
//! `users` descriptor values, on one thread.
//!
//! A load generator shares a core with Redis in the bench, so it must cost little: like
//! h2load with a pre-encoded body, it speaks HTTP/2 directly (the `h2` crate) and sends
//! requests encoded once at start (one per user), where a tonic client would encode each
//! message and run it through its own middleware. It reads an answer's code from the first
//! field of the message and its gRPC status from the trailers.
//!
//! With `json` last it sends Spillway's own check (`POST /api/v1/check`, the policy in place
//! of the domain) over the same HTTP/2 connections instead: a 200 is ok, a 429 over.
//!
//! `grpcload <host:port> <seconds> <connections> <streams> <users> <domain> <service key> [json]`
//! prints one line: `requests=N rps=R p50_ms=A p99_ms=B ok=O over=V errors=E`.

use std::{
    cell::RefCell,
    rc::Rc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use envoy_types::pb::envoy::{
    extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry},
    service::ratelimit::v3::{RateLimitRequest, RateLimitResponse, rate_limit_response::Code},
};
use http::{HeaderValue, Request, Uri};
use prost::Message;

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    ok: u64,
    over: u64,
    errors: u64,
}

/// What one call came back as.
enum Answer {
    Ok,
    Over,
    Error,
}

/// `ShouldRateLimit` for `user`, framed as gRPC sends it: no compression, length, message.
fn encoded(domain: &str, user: u64) -> Bytes {
    let message = RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: user.to_string(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    let len = message.encoded_len();
    let mut frame = Vec::with_capacity(5 + len);
    frame.push(0);
    frame.extend_from_slice(&(len as u32).to_be_bytes());
    message.encode(&mut frame).expect("a Vec grows");
    Bytes::from(frame)
}

/// The answer's code: `overall_code` is field 1, a varint, written first; a longer reading
/// only when it is not there.
fn code_of(message: &[u8]) -> Option<i32> {
    match message {
        [0x08, code, ..] if *code < 0x80 => Some(i32::from(*code)),
        _ => RateLimitResponse::decode(message)
            .ok()
            .map(|r| r.overall_code),
    }
}

/// Spillway's JSON check for `user`.
fn check_json(policy: &str, user: u64) -> Bytes {
    Bytes::from(format!(
        r#"{{"policy":"{policy}","identifiers":{{"user":"{user}"}}}}"#
    ))
}

async fn call(
    sender: &mut h2::client::SendRequest<Bytes>,
    uri: &Uri,
    authorization: &HeaderValue,
    body: Bytes,
    json: bool,
) -> Result<Answer, h2::Error> {
    let request = if json {
        Request::post(uri.clone()).header("content-type", "application/json")
    } else {
        Request::post(uri.clone())
            .header("content-type", "application/grpc")
            .header("te", "trailers")
    };
    let mut request = request.body(()).expect("a valid request");
    request
        .headers_mut()
        .insert("authorization", authorization.clone());
    let ready = sender.clone().ready().await?;
    *sender = ready;
    let (response, mut stream) = sender.send_request(request, false)?;
    stream.send_data(body, true)?;
    let response = response.await?;
    if json {
        let status = response.status().as_u16();
        let mut body = response.into_body();
        while let Some(chunk) = body.data().await {
            let _ = body.flow_control().release_capacity(chunk?.len());
        }
        return Ok(match status {
            200 => Answer::Ok,
            429 => Answer::Over,
            _ => Answer::Error,
        });
    }
    let grpc_status = |h: &http::HeaderMap| h.get("grpc-status").map(|v| v.as_bytes() == b"0");
    // A trailers-only answer (an error) carries its status in the headers.
    if grpc_status(response.headers()) == Some(false) {
        return Ok(Answer::Error);
    }
    let mut body = response.into_body();
    let mut data = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await?;
    if trailers.as_ref().and_then(grpc_status) != Some(true) || data.len() < 5 {
        return Ok(Answer::Error);
    }
    Ok(match code_of(&data[5..]) {
        Some(c) if c == Code::Ok as i32 => Answer::Ok,
        Some(c) if c == Code::OverLimit as i32 => Answer::Over,
        _ => Answer::Error,
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.len() == 8 && args[7] == "json";
    if args.len() != 7 && !json {
        eprintln!(
            "usage: grpcload <host:port> <seconds> <connections> <streams> <users> <domain> <service key> [json]"
        );
        std::process::exit(2);
    }
    let n = |i: usize| -> u64 { args[i].parse().expect("a whole number") };
    let (addr, seconds, connections, streams, users) = (args[0].clone(), n(1), n(2), n(3), n(4));
    let (domain, key) = (args[5].clone(), args[6].clone());
    let bodies: Rc<Vec<Bytes>> = Rc::new(
        (0..users)
            .map(|u| {
                if json {
                    check_json(&domain, u)
                } else {
                    encoded(&domain, u)
                }
            })
            .collect(),
    );
    let path = if json {
        "/api/v1/check"
    } else {
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    };
    let uri: Uri = format!("http://{addr}{path}")
        .parse()
        .expect("a valid address");
    let authorization = HeaderValue::try_from(format!("Bearer {key}")).expect("a printable key");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    let tally = Rc::new(RefCell::new(Tally::default()));
    let started = Instant::now();
    local.block_on(&runtime, async {
        let mut senders = Vec::new();
        for _ in 0..connections {
            let tcp = tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connects");
            tcp.set_nodelay(true).expect("TCP_NODELAY");
            let (sender, connection) = h2::client::handshake(tcp).await.expect("HTTP/2");
            tokio::task::spawn_local(async move {
                let _ = connection.await;
            });
            senders.push(sender);
        }
        let until = Instant::now() + Duration::from_secs(seconds);
        let mut tasks = Vec::new();
        for s in 0..streams {
            let mut sender = senders[(s % connections) as usize].clone();
            let (tally, bodies, uri, authorization) = (
                tally.clone(),
                bodies.clone(),
                uri.clone(),
                authorization.clone(),
            );
            tasks.push(tokio::task::spawn_local(async move {
                // A small xorshift per caller: random users without a shared generator.
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (s + 1);
                while Instant::now() < until {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let body = bodies[(x % users) as usize].clone();
                    let sent = Instant::now();
                    let answer = call(&mut sender, &uri, &authorization, body, json).await;
                    let mut t = tally.borrow_mut();
                    t.latencies_us.push(sent.elapsed().as_micros() as u64);
                    match answer {
                        Ok(Answer::Ok) => t.ok += 1,
                        Ok(Answer::Over) => t.over += 1,
                        Ok(Answer::Error) | Err(_) => t.errors += 1,
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
