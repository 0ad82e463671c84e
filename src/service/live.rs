//! Denials this instance answers from its over-limit cache never reach Redis, so the
//! overview would not see them. They are counted here and added to the live counters once a
//! second, in one script call per policy.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::{
    shutdown::Shutdown,
    store::{Store, stats::label},
};

#[derive(Default)]
struct Pending {
    denied: u64,
    by_identifier: HashMap<String, u64>,
}

/// Cached denials waiting to be counted, per policy.
#[derive(Clone, Default)]
pub struct LiveCounts {
    pending: Arc<Mutex<HashMap<String, Pending>>>,
}

impl LiveCounts {
    /// Notes one denial answered from the cache; `identifier` is the one that bound.
    pub fn denied_from_cache(&self, policy: &str, identifier: Option<String>) {
        let mut pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let p = pending.entry(policy.to_owned()).or_default();
        p.denied += 1;
        if let Some(id) = identifier {
            // Bounded: a flood of distinct identifiers keeps only the first thousand.
            if p.by_identifier.len() < 1000 || p.by_identifier.contains_key(&id) {
                *p.by_identifier.entry(id).or_default() += 1;
            }
        }
    }

    /// Flushes every second until the server stops.
    pub fn spawn_flusher(&self, store: Store, shutdown: &Shutdown) {
        let counts = self.clone();
        shutdown.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let drained: Vec<(String, Pending)> = counts
                    .pending
                    .lock()
                    .expect("live counts lock")
                    .drain()
                    .collect();
                for (policy, p) in drained {
                    let labels: Vec<(String, u64)> = p
                        .by_identifier
                        .into_iter()
                        .map(|(id, n)| (label(&policy, &id), n))
                        .collect();
                    if let Err(error) = store.add_stats(&policy, 0, p.denied, &labels).await {
                        tracing::debug!(%error, "could not add cached denials to the counters");
                    }
                }
            }
        });
    }
}
