//! What a check asks ([`Check`]: a cost, limits sent with it) and [`Checker`], what every
//! Spillway client does: [`Client`](crate::Client) against a server,
//! [`Fake`](crate::testing::Fake) in memory. The layer and a service's own code take either;
//! peeks, the bounded wait, leases and reserve-then-report are written once, here and in
//! `leases`, on top of the four calls each implements.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::{BatchCheck, Decision, Error, Identifiers, Outcome};

/// Limits sent with a check: rule → parameter field → value (`{"per-customer": {"limit":
/// 500}}`). Each must be within the rule's `caller_max`; counters are kept per set of numbers.
pub type Limits = BTreeMap<String, BTreeMap<String, u64>>;

/// What one check asks beyond its policy and identifiers.
///
/// ```
/// # use spillway_client::Check;
/// let pro = Check::cost(1).limit("per-customer", "limit", 500);
/// assert_eq!(pro.limits["per-customer"]["limit"], 500);
/// assert_eq!(Check::default(), Check::cost(1));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// Units to count (1 by default; 0 peeks).
    pub cost: u64,
    /// The rules' numbers for this check only; empty: the policy's own.
    pub limits: Limits,
}

impl Default for Check {
    fn default() -> Self {
        Self::cost(1)
    }
}

impl Check {
    /// A check of `cost` units under the policy's own limits.
    pub fn cost(cost: u64) -> Self {
        Self {
            cost,
            limits: Limits::new(),
        }
    }

    /// With `rule`'s parameter `field` (`limit`, `window_ms`, …) set to `value`.
    pub fn limit(mut self, rule: impl Into<String>, field: impl Into<String>, value: u64) -> Self {
        self.limits
            .entry(rule.into())
            .or_default()
            .insert(field.into(), value);
        self
    }

    /// The request body of a check of `policy` (also a batch's item).
    pub(crate) fn body(&self, policy: &str, identifiers: &Identifiers) -> serde_json::Value {
        let mut body =
            serde_json::json!({"policy": policy, "identifiers": identifiers, "cost": self.cost});
        if !self.limits.is_empty() {
            body["limits"] = serde_json::json!(self.limits);
        }
        body
    }
}

/// What a Spillway client does: implemented by [`Client`](crate::Client) and by
/// [`Fake`](crate::testing::Fake), taken by [`SpillwayLayer`](crate::SpillwayLayer). Code
/// that should run against either takes `impl Checker` (the client's own methods of the same
/// names need no import; these do: `use spillway_client::Checker`).
pub trait Checker: Clone + Send + Sync + 'static {
    /// Checks `check.cost` units of `policy` for these identifiers, with `check.limits`.
    /// Never fails: a check that could not be decided is a [`Decision`] whose [`Outcome`]
    /// says why.
    fn check_with(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        check: Check,
    ) -> impl Future<Output = Decision> + Send;

    /// One [`Decision`] per check, in order.
    fn check_batch(&self, checks: &[BatchCheck]) -> impl Future<Output = Vec<Decision>> + Send;

    /// Usage known after the fact added to every rule; a negative `cost` gives back.
    fn report(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        cost: i64,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Releases leases (idempotent).
    fn release(&self, leases: &[String]) -> impl Future<Output = Result<(), Error>> + Send;

    /// Extends leases by their rule's lease length from now.
    fn renew(&self, leases: &[String]) -> impl Future<Output = Result<(), Error>> + Send;

    /// Checks `cost` units of `policy` under its own limits.
    fn check(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        cost: u64,
    ) -> impl Future<Output = Decision> + Send {
        self.check_with(policy, identifiers, Check::cost(cost))
    }

    /// The identifiers' state under `policy` without consuming anything: a check of cost 0
    /// (no lease taken). `decision.answer().remaining` is what is left of the binding rule.
    fn peek(
        &self,
        policy: &str,
        identifiers: &Identifiers,
    ) -> impl Future<Output = Decision> + Send {
        self.check_with(policy, identifiers, Check::cost(0))
    }

    /// Checks (cost 1); while denied by a limit, sleeps the denial's `Retry-After` and checks
    /// again, never past `max_wait` from the call. Returns the last decision: see
    /// [`Checker::wait_until_allowed_with`].
    fn wait_until_allowed(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        max_wait: Duration,
    ) -> impl Future<Output = Decision> + Send {
        self.wait_until_allowed_with(policy, identifiers, Check::default(), max_wait)
    }

    /// [`Checker::wait_until_allowed`] of any [`Check`]. Returns the last decision: allowed;
    /// or the denial still standing, at once when its `Retry-After` ends past the deadline
    /// (no wait would let it pass, unless only a `concurrency` rule denied, whose slot may
    /// free sooner: then it waits, and checks once more at the deadline); or an unavailable,
    /// misconfigured or too costly check as it came.
    fn wait_until_allowed_with(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        check: Check,
        max_wait: Duration,
    ) -> impl Future<Output = Decision> + Send {
        async move {
            let deadline = Instant::now() + max_wait;
            loop {
                let decision = self.check_with(policy, identifiers, check.clone()).await;
                let Outcome::Limited {
                    retry_after: Some(retry),
                } = decision.outcome()
                else {
                    return decision;
                };
                let left = deadline.saturating_duration_since(Instant::now());
                // A little past Retry-After, so the denial cache has let go of it by then.
                let wait = *retry + Duration::from_millis(10);
                if left.is_zero() || (wait > left && !denied_by_concurrency_only(&decision)) {
                    return decision;
                }
                tokio::time::sleep(wait.min(left)).await;
            }
        }
    }

    /// Checks `policy` (cost 1), runs `work` if allowed, renews the check's leases while it
    /// runs and releases them however it ends. A refusal is `Err` with the decision.
    fn with_lease<T, F, Fut>(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        work: F,
    ) -> impl Future<Output = Result<T, Decision>> + Send
    where
        F: FnOnce(&Decision) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        crate::leases::with_lease(self, policy, identifiers, work)
    }

    /// Reserve, then report: checks `estimate`, runs `work` if allowed, reports what it
    /// really used minus the estimate, or gives the whole estimate back when it fails.
    fn reserve<T, E, F, Fut>(
        &self,
        policy: &str,
        identifiers: &Identifiers,
        estimate: u64,
        work: F,
    ) -> impl Future<Output = Result<Result<T, E>, Decision>> + Send
    where
        F: FnOnce(&Decision) -> Fut + Send,
        Fut: Future<Output = Result<(T, u64), E>> + Send,
        T: Send,
        E: Send,
    {
        crate::leases::reserve(self, policy, identifiers, estimate, work)
    }
}

/// Every rule that denied is a `concurrency` rule: a release may free a slot at any moment,
/// so its `Retry-After` is only a hint.
fn denied_by_concurrency_only(decision: &Decision) -> bool {
    let mut denied = decision
        .answer()
        .into_iter()
        .flat_map(|a| a.results.iter().filter(|r| !r.allowed))
        .peekable();
    denied.peek().is_some() && denied.all(|r| r.algorithm == "concurrency")
}
