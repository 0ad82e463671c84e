//! Open-loop load for `make bench`: POST /api/v1/check at a fixed rate whatever the answers
//! take, over keep-alive connections, on one thread. Each request has a planned send time
//! (start + i / rate); its latency counts from that plan whenever its connection was still
//! busy with the previous answer (so a slow server cannot slow the load down and hide its
//! own queueing: no coordinated omission), and from the actual send otherwise (so the
//! timer's own lateness is not charged to the server).
//!
//! The send times come from a pacing thread that sleeps with the OS's timer (tens of µs
//! late at most), not from tokio's timer, whose 1 ms ticks would send each millisecond's
//! requests together in a burst: a load that is only "fixed rate" per millisecond.
//!
//! `openloop <host:port> <rate/s> <seconds> <connections> <users> <api key>` prints one
//! line: `requests=N rps=R p50_ms=A p99_ms=B p999_ms=C max_ms=D non2xx=E`.

use std::{
    rc::Rc,
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
};

struct Plan {
    addr: String,
    rate: f64,
    total: u64,
    connections: u64,
    users: u64,
    key: String,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 6 {
        eprintln!("usage: openloop <host:port> <rate/s> <seconds> <connections> <users> <api key>");
        std::process::exit(2);
    }
    let number = |i: usize| -> f64 {
        args[i].parse().unwrap_or_else(|_| {
            eprintln!("openloop: argument {} must be a number", i + 1);
            std::process::exit(2)
        })
    };
    let (rate, seconds) = (number(1), number(2));
    let plan = Rc::new(Plan {
        addr: args[0].clone(),
        rate,
        total: (rate * seconds) as u64,
        connections: number(3) as u64,
        users: number(4) as u64,
        key: args[5].clone(),
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let local = tokio::task::LocalSet::new();
    let (mut latencies, non2xx, elapsed) = local.block_on(&runtime, run(plan.clone()));
    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i].as_secs_f64() * 1000.0
    };
    println!(
        "requests={} rps={:.0} p50_ms={:.3} p99_ms={:.3} p999_ms={:.3} max_ms={:.3} non2xx={}",
        latencies.len(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        pct(0.50),
        pct(0.99),
        pct(0.999),
        pct(1.0),
        non2xx
    );
}

async fn run(plan: Rc<Plan>) -> (Vec<Duration>, u64, Duration) {
    let start = Instant::now() + Duration::from_millis(50);
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..plan.connections)
        .map(|_| tokio::sync::mpsc::unbounded_channel::<u64>())
        .unzip();
    let tasks: Vec<_> = receivers
        .into_iter()
        .map(|due| tokio::task::spawn_local(connection(plan.clone(), due, start)))
        .collect();
    // The pacer: request i is due at start + i / rate, on connection i % connections.
    let (rate, total, connections) = (plan.rate, plan.total, plan.connections);
    let pacer = std::thread::spawn(move || {
        for i in 0..total {
            let planned = start + Duration::from_secs_f64(i as f64 / rate);
            let now = Instant::now();
            if planned > now {
                std::thread::sleep(planned - now);
            }
            let _ = senders[(i % connections) as usize].send(i);
        }
    });
    let mut latencies = Vec::with_capacity(plan.total as usize);
    let mut non2xx = 0;
    for task in tasks {
        let (l, n) = task.await.expect("a connection task");
        latencies.extend(l);
        non2xx += n;
    }
    pacer.join().expect("the pacer");
    (latencies, non2xx, start.elapsed())
}

async fn connection(
    plan: Rc<Plan>,
    mut due: tokio::sync::mpsc::UnboundedReceiver<u64>,
    start: Instant,
) -> (Vec<Duration>, u64) {
    let stream = TcpStream::connect(&plan.addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut latencies = Vec::new();
    let mut non2xx = 0;
    let mut free_at = start;
    let mut line = String::new();
    let mut body = Vec::new();
    while let Some(i) = due.recv().await {
        let planned = start + Duration::from_secs_f64(i as f64 / plan.rate);
        // Busy past the plan: the wait is the server's. Free: the timer's lateness is ours.
        let from = if free_at > planned {
            planned
        } else {
            Instant::now()
        };
        let user = (i * 2_654_435_761) % plan.users.max(1);
        let json = format!(r#"{{"policy":"one","identifiers":{{"user":"{user}"}}}}"#);
        let request = format!(
            "POST /api/v1/check HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{json}",
            plan.addr,
            plan.key,
            json.len()
        );
        write.write_all(request.as_bytes()).await.expect("send");
        // Status line, headers, then exactly Content-Length bytes of body.
        line.clear();
        read.read_line(&mut line).await.expect("status line");
        if !line.starts_with("HTTP/1.1 2") {
            non2xx += 1;
        }
        let mut length = 0usize;
        loop {
            line.clear();
            read.read_line(&mut line).await.expect("header");
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().expect("a content length");
            }
        }
        body.resize(length, 0);
        read.read_exact(&mut body).await.expect("body");
        free_at = Instant::now();
        latencies.push(free_at - from);
    }
    (latencies, non2xx)
}
