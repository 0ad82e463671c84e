//! Waiting for what a test can observe, never for a length of time: [`eventually`] asks a
//! probe again and again until its answer is the one awaited, and on a deadline fails
//! saying what it waited for, how long, and what it saw last. The deadline only bounds a
//! failure: a busy machine makes a test slower, never decides its verdict.

use std::{
    fmt::Debug,
    time::{Duration, Instant},
};

/// How long a test waits for what happens on its own (a flush reaching Redis, another
/// instance learning a change, a delivery, a restart): generous, since the machine may be
/// busy with other tests and builds. Tests that promise a time keep their own bound.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// The pause between two looks.
const EVERY: Duration = Duration::from_millis(40);

/// Runs `probe` until `done` holds for what it returns, every 40 ms, and returns that
/// answer. Panics once `deadline` has passed with `what`, the time waited and the last
/// answer seen. The first answer is always looked at, however long it took.
pub async fn eventually<T: Debug>(
    what: &str,
    deadline: Duration,
    mut probe: impl AsyncFnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let started = Instant::now();
    loop {
        let seen = probe().await;
        if done(&seen) {
            return seen;
        }
        let waited = started.elapsed();
        assert!(
            waited < deadline,
            "{what}: not within {deadline:?} (waited {waited:?}); last seen: {seen:?}"
        );
        tokio::time::sleep(EVERY).await;
    }
}

/// [`eventually`] for a probe outside async code (a fixture starting a process, a
/// blocking task): the thread sleeps between looks.
pub fn eventually_sync<T: Debug>(
    what: &str,
    deadline: Duration,
    mut probe: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let started = Instant::now();
    loop {
        let seen = probe();
        if done(&seen) {
            return seen;
        }
        let waited = started.elapsed();
        assert!(
            waited < deadline,
            "{what}: not within {deadline:?} (waited {waited:?}); last seen: {seen:?}"
        );
        std::thread::sleep(EVERY);
    }
}

/// The answer awaited comes back; a probe that never gives it fails naming what was
/// awaited and the last answer.
#[tokio::test]
async fn eventually_returns_the_answer_or_says_what_it_saw_last() {
    let mut n = 0;
    let three = eventually(
        "three",
        PATIENCE,
        async || {
            n += 1;
            n
        },
        |n| *n == 3,
    )
    .await;
    assert_eq!(three, 3);
    let failed = tokio::spawn(async {
        eventually(
            "a seven",
            Duration::from_millis(100),
            async || 6,
            |n| *n == 7,
        )
        .await
    })
    .await
    .unwrap_err();
    let message = failed.into_panic();
    let message = message.downcast_ref::<String>().unwrap();
    assert!(
        message.starts_with("a seven: not within 100ms (waited ")
            && message.ends_with("last seen: 6"),
        "{message}"
    );
    let mut m = 0;
    let sync = eventually_sync(
        "two",
        PATIENCE,
        || {
            m += 1;
            m
        },
        |m| *m == 2,
    );
    assert_eq!(sync, 2);
}
