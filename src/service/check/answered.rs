//! What every answered check leaves behind, JSON or Envoy's: the failure mode's answer
//! when Redis could not be asked, the live view's companions and denial, and the outcome
//! for history, metrics and the trace.

use super::*;

/// The steps every check shares after its decision, whatever door it came in by (the JSON
/// check and batch, forward-auth, Envoy's gRPC and `/json`): the failure mode when Redis
/// failed, then the history and the metrics.
impl Service {
    /// Applies `policy`'s failure mode to a Redis failure: `Ok` when it fails open (the
    /// check answers degraded), the error when it fails closed, recorded as such for
    /// `identifiers` (the history's degraded count, the `unavailable` metric).
    pub(in crate::service) fn failure_mode<'a>(
        &self,
        policy: &Policy,
        error: StoreError,
        identifiers: impl IntoIterator<Item = &'a Identifier>,
        started: std::time::Instant,
    ) -> Result<(), StoreError> {
        // Logged by the outage's changes of state (`RedisOutage`), not per check.
        tracing::debug!(%error, policy = %policy.name, "check failed on redis");
        match policy.failure_mode {
            FailureMode::Open => Ok(()),
            FailureMode::Closed => {
                self.history.record(
                    policy.name.as_str(),
                    history::Outcome::Degraded,
                    identifiers,
                    None,
                );
                crate::telemetry::metrics::check_done(
                    policy.name.as_str(),
                    "unavailable",
                    started.elapsed().as_secs_f64(),
                );
                Err(error)
            }
        }
    }

    /// The ending every answered check shares, JSON or Envoy's: the live view hears who
    /// was checked together and who was denied under which rule (not when Redis was not
    /// asked), and history, metrics and the trace hear the outcome. `limited`: the
    /// identifiers a rule limited.
    pub(in crate::service) fn settle<'a>(
        &self,
        settled: Settled<'_>,
        limited: impl IntoIterator<Item = &'a Identifier> + Clone,
        started: std::time::Instant,
    ) {
        if !settled.degraded {
            let now_ms = crate::service::now_ms();
            self.live.checked_together(settled.together, now_ms);
            self.live.streak_check(
                settled.policy.name.as_str(),
                settled.together,
                // A shadow denial let the request through: no streak.
                settled.outcome == history::Outcome::Denied,
                now_ms,
            );
            if let Some(denial) = settled.denial {
                self.live.denied(
                    settled.policy.name.as_str(),
                    denial,
                    limited.clone(),
                    now_ms,
                );
            }
        }
        // The history counts every identifier the check carried: `user=scraper`, denied
        // through the address a rule limits, was denied too.
        self.answered(
            settled.policy,
            settled.outcome,
            settled.together,
            settled.denial.map(|d| d.identifier),
            started,
        );
    }

    /// Records an answered check of `identifiers` under `policy`: the history (with the
    /// identifier that denied it, if one did) and the metrics.
    pub(in crate::service) fn answered<'a>(
        &self,
        policy: &Policy,
        outcome: history::Outcome,
        identifiers: impl IntoIterator<Item = &'a Identifier>,
        denied_by: Option<&Identifier>,
        started: std::time::Instant,
    ) {
        crate::telemetry::traces::record(|| {
            use opentelemetry::KeyValue;
            let mut attributes = vec![
                KeyValue::new("spillway.policy", policy.name.to_string()),
                KeyValue::new("spillway.outcome", outcome.label()),
            ];
            if let Some(denied_by) = denied_by {
                attributes.push(KeyValue::new("spillway.denied_by", denied_by.to_string()));
            }
            attributes
        });
        self.history
            .record(policy.name.as_str(), outcome, identifiers, denied_by);
        crate::telemetry::metrics::check_done(
            policy.name.as_str(),
            outcome.label(),
            started.elapsed().as_secs_f64(),
        );
    }
}

/// What an answered check settles: see [`Service::settle`].
pub(in crate::service) struct Settled<'a> {
    pub policy: &'a Policy,
    pub outcome: history::Outcome,
    /// Redis was not asked (the failure mode answered): nothing to tell the live view.
    pub degraded: bool,
    /// Every identifier the check carried.
    pub together: &'a [Identifier],
    /// The denial that bound, if one did.
    pub denial: Option<Denial<'a>>,
}
