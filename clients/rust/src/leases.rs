//! Work done under a check: leases held (renewed, then released however the work ends) and
//! reserve-then-report, written once for every [`Checker`].

use std::future::Future;

use crate::{Checker, Decision, Identifiers};

/// Checks `policy` (cost 1), runs `work` if allowed, renews the check's leases while it
/// runs, and releases them however it ends (returned, panicked or dropped).
pub(crate) async fn with_lease<C, T, F, Fut>(
    checker: &C,
    policy: &str,
    identifiers: &Identifiers,
    work: F,
) -> Result<T, Decision>
where
    C: Checker,
    F: FnOnce(&Decision) -> Fut,
    Fut: Future<Output = T>,
{
    let decision = checker.check(policy, identifiers, 1).await;
    if !decision.allowed() {
        return Err(decision);
    }
    let mut held = Leases::renewed(checker.clone(), &decision);
    let out = work(&decision).await;
    held.release().await;
    Ok(out)
}

/// Checks `estimate`, runs `work` if allowed; `work` answers what it really used, and the
/// difference is reported. When `work` fails (or is dropped) the whole estimate is given
/// back.
pub(crate) async fn reserve<C, T, E, F, Fut>(
    checker: &C,
    policy: &str,
    identifiers: &Identifiers,
    estimate: u64,
    work: F,
) -> Result<Result<T, E>, Decision>
where
    C: Checker,
    F: FnOnce(&Decision) -> Fut,
    Fut: Future<Output = Result<(T, u64), E>>,
{
    let decision = checker.check(policy, identifiers, estimate).await;
    if !decision.allowed() {
        return Err(decision);
    }
    // Only what Spillway counted is settled: not a check let through open, degraded or
    // shadow-denied (which consumed nothing).
    let counted = decision
        .answer()
        .is_some_and(|a| !a.degraded && a.shadow_denied != Some(true));
    // The check's own leases (a policy with a concurrency rule too) are renewed while the
    // work runs, however long it takes, and end with it.
    let mut held = Leases::renewed(checker.clone(), &decision);
    let mut pending = counted.then(|| Reservation {
        checker: checker.clone(),
        policy: policy.to_owned(),
        identifiers: identifiers.clone(),
        estimate,
        settled: false,
    });
    let out = work(&decision).await;
    if let Some(reservation) = pending.as_mut() {
        let delta = match &out {
            Ok((_, used)) => *used as i64 - estimate as i64,
            Err(_) => -(estimate as i64),
        };
        reservation.settle(delta).await;
    }
    held.release().await;
    Ok(out.map(|(value, _)| value))
}

/// Leases held while work runs; released when dropped if not released before. Those of
/// [`Leases::renewed`] are renewed meanwhile.
pub(crate) struct Leases<C: Checker> {
    checker: C,
    ids: Vec<String>,
    renewer: Option<tokio::task::JoinHandle<()>>,
}

impl<C: Checker> Leases<C> {
    /// A decision's leases, renewed every third of the shortest time one has left until they
    /// are released (or dropped).
    pub(crate) fn renewed(checker: C, decision: &Decision) -> Self {
        let mut held = Self {
            checker,
            ids: decision.leases(),
            renewer: None,
        };
        if let (Some(every), false) = (decision.renew_every(), held.ids.is_empty()) {
            let (checker, ids) = (held.checker.clone(), held.ids.clone());
            held.renewer = Some(tokio::spawn(async move {
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                loop {
                    tick.tick().await;
                    if let Err(e) = checker.renew(&ids).await {
                        tracing::warn!(error = %e, "renewing leases failed");
                    }
                }
            }));
        }
        held
    }

    pub(crate) async fn release(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        let ids = std::mem::take(&mut self.ids);
        if !ids.is_empty()
            && let Err(e) = self.checker.release(&ids).await
        {
            tracing::warn!(error = %e, "releasing leases failed (they end with their lease time)");
        }
    }
}

impl<C: Checker> Drop for Leases<C> {
    fn drop(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        let ids = std::mem::take(&mut self.ids);
        if ids.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let checker = self.checker.clone();
            runtime.spawn(async move {
                if let Err(e) = checker.release(&ids).await {
                    tracing::warn!(error = %e, "releasing leases failed (they end with their lease time)");
                }
            });
        }
    }
}

/// An estimate checked and not yet settled: given back whole if dropped unsettled (the work
/// panicked or the request was cancelled).
struct Reservation<C: Checker> {
    checker: C,
    policy: String,
    identifiers: Identifiers,
    estimate: u64,
    settled: bool,
}

impl<C: Checker> Reservation<C> {
    async fn settle(&mut self, delta: i64) {
        self.settled = true;
        if delta != 0
            && let Err(e) = self
                .checker
                .report(&self.policy, &self.identifiers, delta)
                .await
        {
            tracing::warn!(error = %e, policy = self.policy, delta, "reporting usage failed");
        }
    }
}

impl<C: Checker> Drop for Reservation<C> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (checker, policy, identifiers) = (
            self.checker.clone(),
            std::mem::take(&mut self.policy),
            std::mem::take(&mut self.identifiers),
        );
        let delta = -(self.estimate as i64);
        runtime.spawn(async move {
            if let Err(e) = checker.report(&policy, &identifiers, delta).await {
                tracing::warn!(error = %e, policy, delta, "giving back a reservation failed");
            }
        });
    }
}
