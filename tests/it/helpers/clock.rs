//! Waits aligned on the wall clock: a test that counts in a clock-aligned window (fixed
//! windows, Envoy's units) starts clear of the window's next turn.

use std::time::Duration;

/// Waits, when the next turn of a clock-aligned window of `window` (fixed windows, Envoy's
/// units) is near, until it has passed: a test that counts in such a window then has at
/// least half the window, or 10 s, before the count starts again. Without it a test that
/// expects its second request to be denied fails whenever the two straddle a turn.
pub async fn clear_of_window_turn(window: Duration) {
    at_least_before_window_turn(window, (window / 2).min(Duration::from_secs(10))).await;
}

/// Waits, when fewer than `margin` are left before the next turn of a clock-aligned
/// window of `window`, until that turn has passed.
pub async fn at_least_before_window_turn(window: Duration, margin: Duration) {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is past 1970");
    let into = Duration::from_nanos((since_epoch.as_nanos() % window.as_nanos()) as u64);
    let left = window - into;
    if left < margin {
        // Past the turn by a little: Redis's clock is this machine's.
        tokio::time::sleep(left + Duration::from_millis(20)).await;
    }
}

/// The helper leaves at least its margin before the next turn, wherever in the window it
/// is called (10 calls spread over 2.3 windows of 200 ms: some land near a turn), give or
/// take 20 ms for a busy machine.
#[tokio::test]
async fn clear_of_window_turn_leaves_the_margin() {
    let window = Duration::from_millis(200);
    for _ in 0..10 {
        clear_of_window_turn(window).await;
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let left = window.as_nanos() - since_epoch.as_nanos() % window.as_nanos();
        assert!(
            left >= (window / 2).as_nanos() - 20_000_000,
            "{left} ns left"
        );
        // Spreads the calls over the window (the pace of the test, not a wait).
        tokio::time::sleep(Duration::from_millis(45)).await;
    }
}
