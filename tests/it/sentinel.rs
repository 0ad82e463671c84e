//! Redis behind Sentinel (issue 36, item 3): a master, a replica and three sentinels on
//! free ports. The app finds the master through them, follows a failover without a restart
//! (the master killed under load: answers stay within the failure mode), and counts exactly
//! again on the new master.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::helpers::{
    PATIENCE, RedisServer, TestApp, eventually, eventually_sync, free_port, spawn_app_with,
};

/// A replica of `master` and three sentinels watching it, torn down on drop.
struct Sentinels {
    replica: u16,
    ports: Vec<u16>,
    dir: PathBuf,
    children: Vec<Child>,
}

fn redis(port: u16) -> redis::RedisResult<redis::Connection> {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))?
        .get_connection_with_timeout(Duration::from_secs(2))
}

impl Sentinels {
    fn start(master: &RedisServer) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "spillway-sentinel-{}-{}",
            std::process::id(),
            master.port
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let replica = free_port();
        let spawn = |args: Vec<String>| {
            Command::new("redis-server")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server")
        };
        let mut children = vec![spawn(vec![
            "--port".into(),
            replica.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
            "--dir".into(),
            dir.display().to_string(),
            "--replicaof".into(),
            "127.0.0.1".into(),
            master.port.to_string(),
        ])];
        eventually_sync(
            "the replica in sync",
            PATIENCE,
            || {
                redis(replica)
                    .and_then(|mut c| {
                        redis::cmd("INFO")
                            .arg("replication")
                            .query::<String>(&mut c)
                    })
                    .is_ok_and(|i| i.contains("master_link_status:up"))
            },
            |up| *up,
        );
        let mut ports = Vec::new();
        for i in 0..3 {
            let port = free_port();
            let conf = dir.join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor mymaster 127.0.0.1 {} 2\n\
                     sentinel down-after-milliseconds mymaster 1000\n\
                     sentinel failover-timeout mymaster 4000\n\
                     sentinel parallel-syncs mymaster 1\n",
                    dir.display(),
                    master.port
                ),
            )
            .unwrap();
            children.push(spawn(vec![conf.display().to_string(), "--sentinel".into()]));
            ports.push(port);
        }
        for &port in &ports {
            eventually_sync(
                &format!("sentinel {port} seeing the replica"),
                PATIENCE,
                || {
                    let Ok(mut c) = redis(port) else {
                        return false;
                    };
                    redis::cmd("SENTINEL")
                        .arg("replicas")
                        .arg("mymaster")
                        .query::<Vec<Value2>>(&mut c)
                        .is_ok_and(|r| r.len() == 1)
                },
                |sees| *sees,
            );
        }
        Self {
            replica,
            ports,
            dir,
            children,
        }
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/mymaster", hosts.join(","))
    }

    /// The master the sentinels name now.
    fn master_port(&self) -> Option<u16> {
        let answer: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg("mymaster")
            .query(&mut redis(self.ports[0]).ok()?)
            .ok()?;
        answer.and_then(|(_, port)| port.parse().ok())
    }
}

type Value2 = redis::Value;

impl Drop for Sentinels {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn check(app: &TestApp, policy: &str, user: &str) -> (u16, Value) {
    let r = app
        .check(json!({"policy": policy, "identifiers": {"user": user}}))
        .await;
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_is_followed_under_load_within_the_failure_mode_and_counts_stay_exact() {
    let mut master = RedisServer::start();
    let sentinels = Sentinels::start(&master);
    assert_eq!(sentinels.master_port(), Some(master.port));
    let app = spawn_app_with(&master, &[("REDIS_URL", &sentinels.url())]).await;
    app.put_policy(
        "load",
        json!({"strict": false, "failure_mode": "open", "rules": [
            {"name": "big", "algorithm": "fixed_window", "limit": 1000000000, "window_ms": 60000}]}),
    )
    .await;
    app.put_policy(
        "exact",
        json!({"strict": false, "rules": [
            {"name": "five", "algorithm": "fixed_window", "limit": 5, "window_ms": 3600000}]}),
    )
    .await;
    // The policies are on the replica before its master goes.
    let _: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query(&mut redis(master.port).unwrap())
        .unwrap();

    // Load from 8 callers; every answer must be 200 (allowed, or degraded: open).
    let stop = Arc::new(AtomicBool::new(false));
    let (answered, degraded, other) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(std::sync::Mutex::new(Vec::new())),
    );
    let mut load = tokio::task::JoinSet::new();
    for i in 0..8 {
        let (app, stop, answered, degraded, other) = (
            app.clone_client(),
            stop.clone(),
            answered.clone(),
            degraded.clone(),
            other.clone(),
        );
        load.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let (status, body) = check(&app, "load", &format!("u{i}")).await;
                answered.fetch_add(1, Ordering::Relaxed);
                if status != 200 {
                    other.lock().unwrap().push((status, body));
                } else if body["degraded"] == true {
                    degraded.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    // The load is under way.
    eventually(
        "the load's first answers",
        PATIENCE,
        async || answered.load(Ordering::Relaxed),
        |answered| *answered > 0,
    )
    .await;

    let killed = Instant::now();
    master.kill();
    // Until the sentinels promote the replica, answers are degraded; then they are not.
    let (_, _, recovered) = eventually(
        "checks answered by the new master (the master named, a probe's answer)",
        Duration::from_secs(30),
        async || {
            let named = sentinels.master_port();
            let answer = if named == Some(sentinels.replica) {
                Some(check(&app, "load", "probe").await)
            } else {
                None
            };
            (named, answer, killed.elapsed())
        },
        |(_, answer, _)| {
            answer
                .as_ref()
                .is_some_and(|(status, body)| *status == 200 && body["degraded"] == false)
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    load.join_all().await;
    eprintln!(
        "sentinel failover: master killed, checks exact again after {recovered:?}; {} answers, {} degraded",
        answered.load(Ordering::Relaxed),
        degraded.load(Ordering::Relaxed)
    );
    let other = std::mem::take(&mut *other.lock().unwrap());
    assert!(
        other.is_empty(),
        "only the failure mode answered: {other:?}"
    );
    assert!(degraded.load(Ordering::Relaxed) > 0, "the outage was seen");

    // Exact again on the new master: 5 of 12 at once.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..12 {
        let app = app.clone_client();
        tasks.spawn(async move { check(&app, "exact", "after-failover").await.0 });
    }
    let statuses = tasks.join_all().await;
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        5,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        7,
        "{statuses:?}"
    );
}
