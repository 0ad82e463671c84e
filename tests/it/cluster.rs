//! The engine on a local three-master Redis Cluster: the same guarantees as on one server,
//! no CROSSSLOT errors, and refunds when a later slot denies.

use std::time::Duration;

use spillway::store::{Keys, Store};

use crate::{
    engine::{
        admits_exactly_the_limit, denied_checks_consume_nothing,
        one_denial_consumes_nothing_elsewhere,
    },
    helpers::{PATIENCE, RedisCluster, eventually},
};

async fn cluster_store(cluster: &RedisCluster, ns: &str) -> Store {
    Store::connect_cluster(&cluster.urls(), Duration::from_secs(30), Keys::new(ns))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_engine_suite_passes_on_a_cluster() {
    let cluster = RedisCluster::start();
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(cluster_store(&cluster, "conc").await);
    }
    admits_exactly_the_limit(&stores).await;
    denied_checks_consume_nothing(&cluster_store(&cluster, "cost").await).await;

    let decision =
        one_denial_consumes_nothing_elsewhere(&cluster_store(&cluster, "refund").await).await;
    assert!(
        decision.refunded,
        "the ip slot consumed before the user slot denied: {decision:?}"
    );

    // The identifiers really are in different slots (so the refund path was exercised).
    let keys = Keys::new("refund");
    let policy = spillway::domain::Name::parse("api").unwrap();
    let tag = |raw: &str| keys.tag(&policy, &spillway::domain::Identifier::parse(raw).unwrap());
    let mut conn = redis::Client::open(cluster.urls()[0].as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut slot = |t: String| -> i64 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(t)
            .query(&mut conn)
            .unwrap()
    };
    let (ip_slot, user_slot) = (slot(tag("ip=203.0.113.7")), slot(tag("user=42")));
    assert_ne!(ip_slot, user_slot);
}

/// A brace in a value cannot move its key to another slot: the slot is the whole tag's.
#[tokio::test]
async fn braces_in_values_cannot_move_the_slot() {
    let cluster = RedisCluster::start();
    let keys = Keys::new("spw");
    let policy = spillway::domain::Name::parse("api").unwrap();
    let rule = spillway::domain::Name::parse("r").unwrap();
    let algorithm = spillway::domain::Algorithm::FixedWindow {
        limit: 1,
        window_ms: 1000,
    };
    let mut conn = redis::Client::open(cluster.urls()[0].as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    for value in ["}x{", "{user}", "a}{b", "}{"] {
        let id = spillway::domain::Identifier::new("user", value).unwrap();
        let key = keys.rule_state(&policy, &id, &rule, &algorithm);
        let tag = keys.tag(&policy, &id);
        let inner = &tag[1..tag.len() - 1];
        let key_slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query(&mut conn)
            .unwrap();
        let tag_slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(inner)
            .query(&mut conn)
            .unwrap();
        assert_eq!(key_slot, tag_slot, "{key}");
    }
}

/// The whole app on a cluster: sign-in (sessions and their index share a slot), the
/// overview's counters (their own slot, fed by a second call), resets and the audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_on_a_cluster() {
    use serde_json::json;
    use spillway::domain::people::Role;
    let cluster = RedisCluster::start();
    let unused = crate::helpers::RedisServer::start();
    let urls = cluster.urls().join(",");
    let app =
        crate::helpers::spawn_app_with(&unused, &[("REDIS_CLUSTER_URLS", urls.as_str())]).await;
    let store = Store::connect_cluster(&cluster.urls(), Duration::from_secs(5), Keys::default())
        .await
        .unwrap();
    spillway::service::Service::for_command(store.clone())
        .add_user(
            &spillway::service::audit::Actor::default(),
            "ann",
            Role::Support,
            "correct horse battery staple",
        )
        .await
        .unwrap();
    let mut v = crate::auth::Visitor::signed_in(&app, "ann").await;
    app.put_policy(
        "clu",
        json!({"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 10, "window_ms": 60000}]}),
    )
    .await;
    crate::helpers::clear_of_window_turn(Duration::from_secs(60)).await;
    for _ in 0..15 {
        app.check(json!({"policy": "clu", "identifiers": {"user": "9"}}))
            .await;
    }
    // The counters are flushed to the overview every second: all 15 checks, and the
    // throttled list.
    let busy = |overview: &serde_json::Value| {
        overview["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["policy"] == "clu")
            .and_then(|p| p["busy"].as_array())
            .into_iter()
            .flatten()
            .fold((0, 0), |(a, d), s| {
                (a + s[1].as_u64().unwrap(), d + s[2].as_u64().unwrap())
            })
    };
    let overview: serde_json::Value = eventually(
        "the 15 checks in the overview",
        PATIENCE,
        async || {
            v.post_form("/fn/overview", &[], None)
                .await
                .json()
                .await
                .unwrap()
        },
        |overview| {
            let (allowed, denied) = busy(overview);
            allowed + denied >= 15 && overview["throttled"][0].is_object()
        },
    )
    .await;
    let (allowed, denied) = busy(&overview);
    assert_eq!((allowed, denied), (10, 5), "{overview}");
    assert_eq!(
        overview["throttled"][0]["identifier"], "user=9",
        "{overview}"
    );
    let csrf = v.csrf().await;
    let origin = v.origin();
    let r = v
        .post_form(
            "/fn/reset",
            &[
                ("csrf", &csrf),
                ("id", "user=9"),
                ("scope", ""),
                ("reason", "cluster test"),
            ],
            Some(&origin),
        )
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let actions: Vec<String> = store
        .read_audit(&Default::default(), 10, None)
        .await
        .unwrap()
        .into_iter()
        .rev()
        .map(|e| e.action)
        .collect();
    // The first start created the admin; then ann was added.
    assert_eq!(
        actions,
        [
            "user.add",
            "user.add",
            "login.success",
            "policy.save",
            "identifier.reset"
        ]
    );
}

/// The penalty box's key sits beside the rule's state key, in its slot: on a cluster the
/// script reads and writes it without a CROSSSLOT or a MOVED.
#[tokio::test]
async fn a_penalty_box_holds_on_a_cluster() {
    use spillway::{domain::Algorithm, store::Now};
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster, "pb").await;
    let rules = [(
        Algorithm::FixedWindow {
            limit: 1,
            window_ms: 1000,
        },
        false,
        60_000,
    )];
    for tag in ["a", "b", "c", "d"] {
        let keys = vec![format!("pb:{{{tag}}}:per-user:fw")];
        let run = || store.run_check_with_penalties(&keys, &rules, 1, Now::Redis);
        assert!(run().await.unwrap().allowed);
        let tripped = run().await.unwrap();
        assert!(!tripped.allowed && tripped.outcomes[0].penalty);
        let held = run().await.unwrap();
        assert!(held.outcomes[0].penalty);
        assert!(
            held.outcomes[0]
                .retry_after_ms
                .is_some_and(|ms| ms > 59_000)
        );
    }
}

/// The what-if record and its rate counters share a slot (one write is one pipeline on one
/// node), and a backup reads and restores on a cluster too.
#[tokio::test]
async fn the_record_and_a_backup_work_on_a_cluster() {
    use spillway::domain::{Identifier, whatif::Recorded};
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster, "rec").await;
    let now_us = spillway::support::clock::now_us();
    let checks: Vec<Recorded> = (0..50)
        .map(|i| Recorded {
            at_us: now_us + i,
            cost: 1,
            allowed: true,
            identifiers: vec![Identifier::new("user", &format!("u{i}")).unwrap()],
            ..Recorded::default()
        })
        .collect();
    for policy in ["api", "web", "edge"] {
        store
            .record_checks(policy, &checks, 50, 1000)
            .await
            .unwrap();
        let read = store
            .recorded_checks(policy, now_us / 1000 - 60_000, 1000)
            .await
            .unwrap();
        assert_eq!(read.len(), 50, "{policy}");
    }
    let backup = store.backup().await.unwrap();
    store.restore(&backup, &backup).await.unwrap();
    assert_eq!(store.backup().await.unwrap().policies, backup.policies);
}
