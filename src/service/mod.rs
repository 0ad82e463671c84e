//! The use cases every front door calls: checking a policy, inspecting and resetting an
//! identifier, changing policies, reading the audit log, seeding the demo policy. The JSON API, the dashboard's server functions and
//! the command line parse their input, call these, and render what comes back; none of them
//! checks, counts or audits on its own, and this layer knows neither HTTP nor Redis (the
//! store does).
//!
//! With the use cases live the caches they keep in front of Redis: the policies
//! (`policy_cache`), denials that stand until a known time (`deny_cache`) and the denials
//! answered from it, on their way to the overview's counters (`live`), and every answered
//! check on its way to the history (`history`). Their locks recover a poisoned guard
//! (`PoisonError::into_inner`): what they hold (counters, caches, snapshots) is whole at
//! every step, and one panic while a lock was held must not make every later check panic.

pub mod alerts;
pub mod audit;
pub mod check;
pub mod deny_cache;
pub mod envoy;
pub mod history;
pub mod identifiers;
pub mod leases;
pub mod live;
pub mod policies;
pub mod policy_cache;
pub mod report;
pub mod signin;

pub use check::{CheckError, CheckRequest, Checked};

use crate::{clock::now_ms, store::Store};

/// The store and the caches in front of it: what every use case works with. Cloned
/// cheaply (each part is a handle).
#[derive(Clone)]
pub struct Service {
    pub store: Store,
    pub policies: policy_cache::PolicyCache,
    pub denials: deny_cache::DenyCache,
    pub live: live::LiveCounts,
    /// This instance's counts on their way to the history.
    pub history: history::HistoryCounts,
    /// Since when this instance's checks fail on Redis (for the `degraded` alerts).
    pub outage: alerts::RedisOutage,
    /// The internal hosts alert webhooks may reach.
    pub webhook_targets: crate::outbound::Targets,
}
