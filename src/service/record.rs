//! The record of recent checks, and the what-if replay over it.
//!
//! Each counted check (not a peek, nor one answered by a failure mode) is noted in memory
//! and written off the check's path about once a second, to one stream per policy in Redis
//! (`store/record.rs`): at most `SPILLWAY_RECORD_CHECKS` per policy and a day's worth. A
//! replay reads the record and runs a policy's rules (a draft's, or the ones in force) over
//! it in the reference model (`domain::whatif`), on a blocking thread, within a budget, and
//! stops when its caller goes away.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Service;
use super::audit::{Actor, Change};
use crate::domain::whatif::{Recorded, WhatIf, replay};
use crate::domain::{Identifier, Name, Policy, PolicyError};
use crate::store::{Store, StoreError};
use crate::support::shutdown::Shutdown;

/// Checks noted and not yet written, at most; past it a check goes unrecorded (counted in
/// `dropped`).
const MAX_PENDING: usize = 100_000;

/// The longest a replay runs before it answers what it has (`complete: false`).
pub const REPLAY_BUDGET: Duration = Duration::from_secs(20);

/// The longest look back a replay takes (the record keeps a day).
pub const MAX_LOOK_BACK_MS: i64 = crate::store::RECORD_KEEP_MS;

/// Checks noted by this instance, on their way to the record.
#[derive(Clone, Default)]
pub struct Recorder {
    /// Checks kept per policy (0: recording is off).
    max: u64,
    pending: Arc<Mutex<HashMap<String, Vec<Recorded>>>>,
    noted: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
}

impl Recorder {
    pub fn new(max: u64) -> Self {
        Self {
            max,
            ..Self::default()
        }
    }

    /// Notes a decided check of `policy`.
    pub fn note(&self, policy: &str, at_us: i64, cost: u64, allowed: bool, ids: &[Identifier]) {
        if self.max == 0 || cost == 0 {
            return;
        }
        if self.noted.load(Ordering::Relaxed) as usize >= MAX_PENDING {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.noted.fetch_add(1, Ordering::Relaxed);
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if !pending.contains_key(policy) {
            pending.insert(policy.to_owned(), Vec::new());
        }
        pending
            .get_mut(policy)
            .expect("inserted above")
            .push(Recorded {
                at_us,
                cost,
                allowed,
                identifiers: ids.to_vec(),
            });
    }

    /// Writes what was noted every second until the server stops.
    pub fn spawn_flusher(&self, store: Store, shutdown: &Shutdown) {
        if self.max == 0 {
            return;
        }
        let recorder = self.clone();
        shutdown.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                recorder.flush(&store).await;
            }
        });
    }

    /// Writes what was noted; what Redis refused is not kept (the record is a sample of
    /// what happened, and says when it starts).
    pub async fn flush(&self, store: &Store) {
        let drained: Vec<(String, Vec<Recorded>)> = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            self.noted.store(0, Ordering::Relaxed);
            pending.drain().collect()
        };
        for (policy, checks) in drained {
            if let Err(error) = store.record_checks(&policy, &checks, self.max).await {
                tracing::debug!(%error, policy, "could not record checks");
            }
        }
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            tracing::warn!(
                dropped,
                "checks went unrecorded: more than {MAX_PENDING} in a second"
            );
        }
    }
}

/// Why a replay gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum WhatIfError {
    #[error("no policy named {0}")]
    UnknownPolicy(String),
    #[error("{}: {}", .0.field, .0.message)]
    Draft(PolicyError),
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("redis is unavailable: {0}")]
    Unavailable(#[from] StoreError),
}

/// Set when the replay's caller has gone: the replay stops at its next look at the budget.
struct Cancel(Arc<AtomicBool>);

impl Drop for Cancel {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Service {
    /// Notes `checked` for the record, unless a failure mode answered it.
    pub(super) fn record(
        &self,
        checked: &super::check::Checked,
        request: &super::check::CheckRequest,
    ) {
        if checked.degraded {
            return;
        }
        // Redis's clock when it decided; this instance's when no call was made.
        let at_us = match checked.decision.at_us {
            0 => crate::support::clock::now_us(),
            at => at,
        };
        self.recorder.note(
            checked.policy.name.as_str(),
            at_us,
            request.cost,
            checked.decision.allowed,
            &request.identifiers,
        );
    }

    /// Replays `draft` (a policy document; the policy in force when `None`) over `name`'s
    /// checks of the last `look_back_ms`, and says what it would have changed. Audited
    /// (`policy.what-if`).
    pub async fn what_if(
        &self,
        actor: &Actor,
        name: &Name,
        draft: Option<&serde_json::Value>,
        look_back_ms: i64,
    ) -> Result<WhatIf, WhatIfError> {
        let draft = draft
            .map(|doc| Policy::from_document(name.as_str(), doc).map_err(WhatIfError::Draft))
            .transpose()?;
        self.what_if_policy(actor, name, draft, look_back_ms).await
    }

    /// [`Service::what_if`] of a parsed draft (`spillway policy plan`'s file).
    pub async fn what_if_policy(
        &self,
        actor: &Actor,
        name: &Name,
        draft: Option<Policy>,
        look_back_ms: i64,
    ) -> Result<WhatIf, WhatIfError> {
        if !(1..=MAX_LOOK_BACK_MS).contains(&look_back_ms) {
            return Err(WhatIfError::Invalid {
                field: "last_ms",
                message: format!("must be from 1 to {MAX_LOOK_BACK_MS} (the record keeps a day)"),
            });
        }
        let current = self
            .stored_policy(name)
            .await?
            .ok_or_else(|| WhatIfError::UnknownPolicy(name.to_string()))?;
        let is_draft = draft.is_some();
        let policy = draft.unwrap_or(current);
        let since_ms = super::now_ms() - look_back_ms;
        let max = self.record_max();
        let record = self
            .store
            .recorded_checks(name.as_str(), since_ms, max)
            .await?;
        let cancel = Cancel(Arc::new(AtomicBool::new(false)));
        let stop = cancel.0.clone();
        let started = Instant::now();
        let answer = tokio::task::spawn_blocking(move || {
            replay(&policy, &record, || {
                stop.load(Ordering::Relaxed) || started.elapsed() > REPLAY_BUDGET
            })
        })
        .await
        .expect("the replay does not panic");
        drop(cancel);
        let after = serde_json::json!({
            "draft": is_draft,
            "last_ms": look_back_ms,
            "checks": answer.checks,
            "newly_denied": answer.newly_denied,
            "newly_allowed": answer.newly_allowed,
        });
        let _ = actor
            .record(
                &self.store,
                Change {
                    action: "policy.what-if",
                    target: name.as_str(),
                    after: after.to_string(),
                    ..Change::default()
                },
            )
            .await;
        Ok(answer)
    }

    /// Suggested limits for `rule` of the policy `name` in force, from its checks of the
    /// last `look_back_ms` (see `domain::suggest`).
    pub async fn suggest_limits(
        &self,
        name: &Name,
        rule: &str,
        look_back_ms: i64,
    ) -> Result<crate::domain::suggest::Suggestion, WhatIfError> {
        if !(1..=MAX_LOOK_BACK_MS).contains(&look_back_ms) {
            return Err(WhatIfError::Invalid {
                field: "last_ms",
                message: format!("must be from 1 to {MAX_LOOK_BACK_MS} (the record keeps a day)"),
            });
        }
        let policy = self
            .stored_policy(name)
            .await?
            .ok_or_else(|| WhatIfError::UnknownPolicy(name.to_string()))?;
        let since_ms = super::now_ms() - look_back_ms;
        let record = self
            .store
            .recorded_checks(name.as_str(), since_ms, self.record_max())
            .await?;
        let rule = rule.to_owned();
        tokio::task::spawn_blocking(move || {
            crate::domain::suggest::suggest(&policy, &rule, &record)
        })
        .await
        .expect("suggestions do not panic")
        .map_err(|message| WhatIfError::Invalid {
            field: "rule",
            message,
        })
    }

    /// The most recorded checks a replay reads: this instance's setting; a command's
    /// service, which records nothing itself, reads what the servers recorded.
    fn record_max(&self) -> usize {
        usize::try_from(self.recorder.max)
            .ok()
            .filter(|&m| m > 0)
            .unwrap_or(crate::config::MAX_RECORD_CHECKS as usize)
    }
}
