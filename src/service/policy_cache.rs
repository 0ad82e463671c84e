//! The policies every check uses, held in memory so the check path never reads them from
//! Redis. A change made on any instance arrives by pub/sub at once, and a poll of the
//! policy generation every 250 ms catches whatever pub/sub missed (a reconnect, a cluster).

use std::{
    collections::HashMap,
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use crate::{
    domain::{Policy, envoy::Counting},
    service::deny_cache::DenyCache,
    store::{Event, Store, StoreError},
    support::shutdown::Shutdown,
};

type Snapshot = Arc<HashMap<String, Arc<Policy>>>;

/// A shared, cheaply cloned view of every policy.
#[derive(Clone, Default)]
pub struct PolicyCache {
    snapshot: Arc<RwLock<Snapshot>>,
    generation: Arc<AtomicU64>,
    loaded: Arc<AtomicBool>,
    /// How an Envoy domain that does not say counts a hit over its limit.
    envoy_counting: Counting,
    /// Whether every Envoy limit is in quota mode (`SPILLWAY_ENVOY_QUOTA_MODE`).
    envoy_quota_all: bool,
}

impl PolicyCache {
    /// An empty cache whose Envoy domains count as `envoy_counting` unless they say.
    /// Every Envoy limit is in quota mode when `envoy_quota_all`.
    pub fn new(envoy_counting: Counting, envoy_quota_all: bool) -> Self {
        Self {
            envoy_counting,
            envoy_quota_all,
            ..Self::default()
        }
    }

    /// Whether every Envoy limit is in quota mode.
    pub fn envoy_quota_all(&self) -> bool {
        self.envoy_quota_all
    }

    /// How an Envoy domain that does not say counts a hit over its limit.
    pub fn envoy_counting(&self) -> Counting {
        self.envoy_counting
    }

    /// The current version of `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Policy>> {
        self.snapshot
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// Every policy, sorted by name.
    pub fn all(&self) -> Vec<Arc<Policy>> {
        let snapshot = self
            .snapshot
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut all: Vec<Arc<Policy>> = snapshot.values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Whether policies were loaded at least once (false while Redis was never reachable).
    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Reads every policy from Redis and replaces the cache.
    ///
    /// When Redis answers with no policy generation at all although policies were loaded
    /// before, Redis lost its data (restarted without persistence, or flushed): the policies
    /// held here are written back instead of being forgotten, so checks go on unchanged.
    pub async fn reload(&self, store: &Store) -> Result<(), StoreError> {
        let mut generation = store.policy_generation().await?;
        if generation == 0 && self.generation.load(Ordering::Acquire) > 0 {
            let known: Vec<Policy> = self
                .snapshot
                .read()
                .expect("policy cache lock")
                .values()
                .map(|p| (**p).clone())
                .collect();
            if !known.is_empty() {
                tracing::error!(
                    policies = known.len(),
                    "Redis lost every policy; restoring them from memory"
                );
                store.import_policies(&known).await?;
                generation = store.policy_generation().await?;
            }
        }
        let policies = store.list_policies().await?;
        let map: HashMap<String, Arc<Policy>> = policies
            .into_iter()
            .map(|mut p| {
                p.resolve_envoy_counting(self.envoy_counting);
                p.resolve_envoy_quota(self.envoy_quota_all);
                (p.name.as_str().to_owned(), Arc::new(p))
            })
            .collect();
        *self
            .snapshot
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(map);
        self.generation.store(generation, Ordering::Release);
        self.loaded.store(true, Ordering::Release);
        Ok(())
    }

    /// Keeps the cache fresh until the server stops, and forwards resets to `denials` and to
    /// the counters of local rules.
    pub fn spawn_refresher(
        &self,
        store: Store,
        denials: DenyCache,
        local: super::local::LocalCounts,
        shutdown: &Shutdown,
    ) {
        let cache = self.clone();
        shutdown.spawn(async move {
            // Said when loading starts failing and when it works again, not every retry.
            let mut failing = false;
            loop {
                let mut events = store.subscribe().await.ok();
                // Load after subscribing, so no change falls between the two.
                match cache.reload(&store).await {
                    Err(error) if !failing => {
                        failing = true;
                        tracing::warn!(%error, "loading policies failed; retrying until Redis answers (the policies in memory stay in force)");
                    }
                    Err(_) => {}
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!("policies loaded again");
                    }
                    Ok(()) => {}
                }
                loop {
                    let tick = tokio::time::sleep(Duration::from_millis(250));
                    let changed = match events.as_mut() {
                        Some(rx) => tokio::select! {
                            event = rx.recv() => match event {
                                Some(Event::PolicyChanged(_)) => true,
                                Some(Event::Reset { policies, identifier }) => {
                                    denials.invalidate(policies.as_deref(), &identifier);
                                    local.forget(policies.as_deref(), &identifier);
                                    false
                                }
                                None => break, // subscription lost: subscribe again
                            },
                            _ = tick => cache.generation_moved(&store).await,
                        },
                        None => {
                            tick.await;
                            cache.generation_moved(&store).await
                        }
                    };
                    if changed && let Err(error) = cache.reload(&store).await {
                        tracing::warn!(%error, "reloading policies failed");
                    }
                    if events.is_none() && store.is_single() {
                        break; // try to subscribe again
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    }

    async fn generation_moved(&self, store: &Store) -> bool {
        match store.policy_generation().await {
            Ok(g) => g != self.generation.load(Ordering::Acquire) || !self.is_loaded(),
            Err(_) => false,
        }
    }
}
