//! Waiting instead of refusing (`on_deny: wait`): a front door that can hold a request
//! (forward-auth, Envoy's gRPC) holds a denied one until it would pass, then asks again.

use std::time::{Duration, Instant};

use super::Service;

impl Service {
    /// Holds a denied `answer` until it would pass and asks `again`, for as long as the next
    /// try comes before `until` (the policy's `max_wait_ms` from the request's start) and
    /// before `deadline` (the caller's), and a place to wait is free
    /// (`SPILLWAY_MAX_WAITING`); otherwise answers the denial at once. `held` says whether
    /// an answer is a denial to wait out: `None` for an answer to give, `Some(None)` for a
    /// denial no wait ends, `Some(Some(ms))` for one that may pass in `ms`.
    ///
    /// A wait takes no thread (a timer wakes it). `spillway_waits_total` counts how each
    /// ended: `passed`, `too_long`, `full` or `never`.
    pub(crate) async fn hold_while_denied<A, E, Fut>(
        &self,
        policy: &str,
        until: Instant,
        deadline: Option<Instant>,
        mut answer: A,
        held: impl Fn(&A) -> Option<Option<u64>>,
        mut again: impl FnMut() -> Fut,
    ) -> Result<A, E>
    where
        Fut: std::future::Future<Output = Result<A, E>>,
    {
        let give_up = deadline.map_or(until, |d| d.min(until));
        let ended = |how: &'static str| {
            metrics::counter!("spillway_waits_total", "policy" => policy.to_owned(), "outcome" => how)
                .increment(1);
        };
        let mut waited = false;
        loop {
            let retry_ms = match held(&answer) {
                None => {
                    if waited {
                        ended("passed");
                    }
                    return Ok(answer);
                }
                Some(None) => {
                    ended("never");
                    return Ok(answer);
                }
                Some(Some(ms)) => ms,
            };
            let wake = Instant::now() + Duration::from_millis(retry_ms.max(1));
            if wake > give_up {
                ended("too_long");
                return Ok(answer);
            }
            let Ok(_place) = self.waiting.try_acquire() else {
                ended("full");
                return Ok(answer);
            };
            tokio::time::sleep_until(wake.into()).await;
            waited = true;
            answer = again().await?;
        }
    }
}
