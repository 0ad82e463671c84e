//! The in-memory fake behind the `Checker` trait: what a service's own tests rely on (its
//! counting, denials on demand, outages, recorded calls), and the helpers every checker
//! shares (peek, batch, wait, leases, reserve) running on it. Time is tokio's, paused, so
//! no verdict depends on the machine's speed.

use std::time::Duration;

use spillway_client::testing::{Call, Fake, FakePolicy};
use spillway_client::{
    BatchCheck, Check, Checker, Decision, FailMode, Failure, Identifiers, Outcome,
};

fn user(name: &str) -> Identifiers {
    Identifiers::from([("user".to_owned(), name.to_owned())])
}

fn fake() -> Fake {
    Fake::new()
        .policy("api", FakePolicy::window(2, Duration::from_secs(60)))
        .policy(
            "pool",
            FakePolicy::window(100, Duration::from_secs(60)).concurrency(1),
        )
}

/// What a service writes against `impl Checker`: it must be spawnable (its futures Send).
async fn remaining_after_one(checker: impl Checker, who: &str) -> Option<u64> {
    checker.check("api", &user(who), 1).await;
    checker.peek("api", &user(who)).await.answer()?.remaining
}

#[tokio::test(start_paused = true)]
async fn the_fake_counts_a_window_per_policy_and_identifiers() {
    let fake = fake();
    let left = tokio::spawn(remaining_after_one(fake.clone(), "ada"));
    assert_eq!(left.await.unwrap(), Some(1));
    assert!(fake.check("api", &user("ada"), 1).await.allowed());
    let denied = fake.check("api", &user("ada"), 1).await;
    assert!(
        matches!(denied.outcome(), Outcome::Limited { retry_after: Some(r) } if *r <= Duration::from_secs(60))
    );
    assert_eq!(denied.problem().0, 429);
    assert!(denied.headers().iter().any(|(n, _)| n == "retry-after"));
    assert!(fake.check("api", &user("bob"), 1).await.allowed());
    // Limits sent with a check are a counter of their own.
    let pro = Check::cost(1).limit("window", "limit", 5);
    assert!(
        fake.check_with("api", &user("ada"), pro.clone())
            .await
            .allowed()
    );
    let wrong = fake
        .check_with(
            "api",
            &user("ada"),
            Check::cost(1).limit("per-day", "limit", 5),
        )
        .await;
    assert!(matches!(wrong.outcome(), Outcome::Misconfigured { status, .. } if *status == 400));
    assert!(matches!(
        fake.check("api", &user("ada"), 3).await.outcome(),
        Outcome::TooCostly { .. }
    ));
    let unknown = fake.check("nope", &user("ada"), 1).await;
    assert!(matches!(unknown.outcome(), Outcome::Misconfigured { status, .. } if *status == 404));
    // The window ends: counting starts again.
    fake.advance(Duration::from_secs(60));
    assert!(fake.check("api", &user("ada"), 1).await.allowed());
    // Every call is recorded, a peek as a check of cost 0.
    assert_eq!(fake.checks("api").len(), 9);
    assert!(fake.calls().contains(&Call::Check {
        policy: "api".into(),
        identifiers: user("ada"),
        check: Check::cost(0),
    }));
}

#[tokio::test(start_paused = true)]
async fn the_fake_denies_and_fails_on_demand() {
    let fake = fake();
    fake.deny("api", Duration::from_secs(7), 1);
    let denied = fake.check("api", &user("ada"), 1).await;
    assert_eq!(denied.retry_after_secs(), Some(7));
    assert!(fake.check("api", &user("ada"), 1).await.allowed());
    fake.unavailable();
    let closed = fake.check("api", &user("ada"), 1).await;
    assert!(matches!(closed.outcome(), Outcome::Unavailable { .. }) && !closed.allowed());
    assert!(fake.report("api", &user("ada"), 1).await.is_err());
    let open = fake.clone().with_failure(Failure {
        unavailable: FailMode::Open,
        misconfigured: FailMode::Closed,
    });
    assert!(open.check("api", &user("ada"), 1).await.allowed());
    fake.restore();
    assert!(fake.check("api", &user("cy"), 1).await.allowed());
}

#[tokio::test(start_paused = true)]
async fn batch_wait_leases_and_reserve_run_on_the_fake() {
    let fake = fake();
    let batch = fake
        .check_batch(&[
            BatchCheck::new("api", user("ada")),
            BatchCheck::new("api", user("ada")).cost(2),
            BatchCheck::new("nope", user("ada")),
        ])
        .await;
    let allowed: Vec<bool> = batch.iter().map(Decision::allowed).collect();
    assert_eq!(allowed, [true, false, false]);
    // Denied for 60 s: a wait of 1 s returns the denial at once; one of 2 minutes passes.
    fake.check("api", &user("ada"), 1).await;
    let started = tokio::time::Instant::now();
    let short = fake
        .wait_until_allowed("api", &user("ada"), Duration::from_secs(1))
        .await;
    assert!(!short.allowed());
    assert_eq!(started.elapsed(), Duration::ZERO);
    let long = fake
        .wait_until_allowed("api", &user("ada"), Duration::from_secs(120))
        .await;
    assert!(long.allowed());
    assert!(started.elapsed() <= Duration::from_secs(61));
    // A lease is held while the work runs and released after.
    let inside = fake
        .with_lease("pool", &user("ada"), |d| {
            let (fake, leases) = (fake.clone(), d.leases());
            async move {
                assert_eq!(fake.leases(), leases);
                fake.check("pool", &user("ada"), 1).await.allowed()
            }
        })
        .await
        .unwrap();
    assert!(!inside, "a second request in flight was let through");
    assert!(fake.leases().is_empty());
    // Reserve 50, use 20: 30 given back.
    let out = fake
        .reserve("pool", &user("bob"), 50, |_| async {
            Ok::<_, ()>(("done", 20))
        })
        .await
        .unwrap();
    assert_eq!(out, Ok("done"));
    let left = fake.peek("pool", &user("bob")).await;
    assert_eq!(left.answer().unwrap().remaining, Some(80));
    assert!(fake.calls().contains(&Call::Report {
        policy: "pool".into(),
        identifiers: user("bob"),
        cost: -30,
    }));
}
