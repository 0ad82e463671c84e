//! Leases of concurrency rules after the check that took them: the holder releases or
//! renews them by id (the check API's callers), and support staff release one from the
//! inspector with a reason (audited).

use super::Service;
use crate::{
    domain::{Algorithm, RulesFor, lease::LeaseId},
    service::audit::{Actor, Change},
    store::StoreError,
};

/// Most leases one release or renewal names.
pub const MAX_LEASES_PER_CALL: usize = 100;

impl Service {
    /// Releases `leases`; whether each was held. Idempotent.
    pub async fn release_leases(&self, leases: &[LeaseId]) -> Result<Vec<bool>, StoreError> {
        let released = self.store.release_leases(leases).await?;
        crate::telemetry::metrics::leases_released(released.iter().filter(|r| **r).count() as u64);
        Ok(released)
    }

    /// Renews each lease by its rule's `lease_ms` as it applies to the identifier now (an
    /// override's rule of the same name wins): the milliseconds until each runs out, or
    /// `None` for one not held any more (released, run out, or its rule is gone, no longer a
    /// concurrency rule, or the identifier is now unlimited or blocked).
    pub async fn renew_leases(&self, leases: &[LeaseId]) -> Result<Vec<Option<u64>>, StoreError> {
        let mut known = Vec::with_capacity(leases.len());
        let mut places = Vec::with_capacity(leases.len());
        for (i, lease) in leases.iter().enumerate() {
            // The rule as it applies to the identifier now: an override's own, if it has one.
            let lease_ms = self.policies.get(lease.policy.as_str()).and_then(|p| {
                match p.rules_for(&lease.identifier, super::now_ms()) {
                    RulesFor::Rules(rules) => rules.iter().find_map(|r| match r.algorithm {
                        Algorithm::Concurrency { lease_ms, .. } if r.name == lease.rule => {
                            Some(lease_ms)
                        }
                        _ => None,
                    }),
                    RulesFor::Unlimited | RulesFor::Blocked => None,
                }
            });
            if let Some(ms) = lease_ms {
                known.push((lease.clone(), ms));
                places.push(i);
            }
        }
        let renewed = self.store.renew_leases(&known).await?;
        let mut out = vec![None; leases.len()];
        for (i, r) in places.into_iter().zip(renewed) {
            out[i] = r;
        }
        Ok(out)
    }

    /// Support staff release one lease (its holder crashed, say): audited with the reason.
    pub async fn release_lease_by(
        &self,
        actor: &Actor,
        lease: &LeaseId,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let released = self.release_leases(std::slice::from_ref(lease)).await?[0];
        let after = serde_json::json!({
            "policy": lease.policy.as_str(),
            "rule": lease.rule.as_str(),
            "lease": lease.to_string(),
            "released": released,
        });
        let _ = actor
            .record(
                &self.store,
                Change {
                    action: "lease.release",
                    target: &lease.identifier.to_string(),
                    after: after.to_string(),
                    reason,
                    ..Change::default()
                },
            )
            .await;
        Ok(released)
    }
}
