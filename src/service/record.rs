//! The record of recent checks, and the what-if replay over it.
//!
//! Each counted check (not a peek, nor one answered by a failure mode) is noted in memory
//! and written off the check's path about once a second, to one stream per policy in Redis
//! (`store/record.rs`): at most `SPILLWAY_RECORD_CHECKS` per policy and a day's worth. A
//! policy recording a sample (its document's `record`, the default) keeps every check while
//! a day at its rate fits, else the checks of one identifier in 2, 4, 8… (the level, from
//! all instances' count of its checks of the last ten seconds: `domain::whatif::sample`).
//! A replay reads the record and runs a policy's rules (a draft's, or the ones in force) over
//! it in the reference model (`domain::whatif`), on a blocking thread, within a budget, and
//! stops when its caller goes away.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Service;
use super::audit::{Actor, Change};
use crate::domain::policy::Recording;
use crate::domain::whatif::{Recorded, WhatIf, replay, sample};
use crate::domain::{Identifier, Name, Policy, PolicyError};
use crate::store::{Store, StoreError};
use crate::support::shutdown::Shutdown;

/// Checks noted and not yet written, at most; past it a check goes unrecorded (counted in
/// `dropped`).
const MAX_PENDING: usize = 100_000;

/// The longest a replay runs before it answers what it has (`complete: false`): well inside
/// the default request timeout (10 s), so the answer arrives.
pub const REPLAY_BUDGET: Duration = Duration::from_secs(5);

/// The longest look back a replay takes (the record keeps a day).
pub const MAX_LOOK_BACK_MS: i64 = crate::store::RECORD_KEEP_MS;

/// Checks noted by this instance, on their way to the record.
#[derive(Clone, Default)]
pub struct Recorder {
    /// Checks kept per policy (0: recording is off).
    max: u64,
    pending: Arc<Mutex<HashMap<String, Pending, foldhash::fast::RandomState>>>,
    noted: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
}

/// A policy's checks noted since the last write, and the level its record samples at.
#[derive(Default)]
struct Pending {
    checks: Vec<Recorded>,
    /// Checks seen since the last write, recorded or not.
    seen: u64,
    level: u8,
    /// Every check (`record: every`): the level stays 0.
    every: bool,
    /// Writes since this policy last saw a check.
    idle: u32,
    /// Checks its record keeps at most: its own `record_checks` within the server's.
    max: u64,
}

/// Writes (about seconds) a policy may see no check before this instance forgets its level.
const FORGET_AFTER: u32 = 600;

impl Recorder {
    pub fn new(max: u64) -> Self {
        Self {
            max,
            ..Self::default()
        }
    }

    /// Notes a decided check of `policy` (recorded as its `record` says), sampled by the
    /// identifier its first counted dimension names.
    pub fn note(&self, policy: &Policy, at_us: i64, cost: u64, allowed: bool, ids: &[Identifier]) {
        if self.max == 0 || cost == 0 || policy.record == Recording::Off {
            return;
        }
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let name = policy.name.as_str();
        let noted = match pending.get_mut(name) {
            Some(noted) => noted,
            None => pending.entry(name.to_owned()).or_default(),
        };
        noted.every = policy.record == Recording::Every;
        noted.max = policy
            .record_checks
            .map_or(self.max, |own| own.min(self.max));
        // Every check counts toward the rate, recorded or not.
        noted.seen += 1;
        // A burst past a hundredth of the budget in one second samples at once, more as it
        // doubles, before the next write sets the level from the rate.
        let burst = (noted.max / 100).max(1);
        if !noted.every && noted.seen > burst {
            noted.level = noted.level.max(sample::burst_level(noted.seen, burst));
        }
        let level = if noted.every { 0 } else { noted.level };
        let unit = sample::unit_of(policy, ids);
        if ids.get(unit).is_some_and(|id| !sample::keeps(id, level)) {
            return;
        }
        if self.noted.fetch_add(1, Ordering::Relaxed) as usize >= MAX_PENDING {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        noted.checks.push(Recorded {
            at_us,
            cost,
            allowed,
            identifiers: ids.to_vec(),
            level,
            unit: u8::try_from(unit).unwrap_or(0),
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
        let drained: Vec<(String, Vec<Recorded>, u64, u64)> = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            self.noted.store(0, Ordering::Relaxed);
            for p in pending.values_mut() {
                p.idle = if p.seen == 0 { p.idle + 1 } else { 0 };
            }
            pending.retain(|_, p| p.idle < FORGET_AFTER);
            pending
                .iter_mut()
                .filter(|(_, p)| p.seen > 0)
                .map(|(name, p)| {
                    let seen = std::mem::take(&mut p.seen);
                    (name.clone(), std::mem::take(&mut p.checks), seen, p.max)
                })
                .collect()
        };
        for (policy, checks, seen, max) in drained {
            match store.record_checks(&policy, &checks, seen, max).await {
                Ok(before) => self.set_level(&policy, before, seen, max),
                Err(error) => tracing::debug!(%error, policy, "could not record checks"),
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

impl Recorder {
    /// Sets the level `policy` samples at from all instances' count of its checks in the
    /// ten seconds before this (`before`), or this instance's of the last second (`seen`)
    /// when that burst past a hundredth of the budget: whichever samples more.
    fn set_level(&self, policy: &str, before: u64, seen: u64, max: u64) {
        let day = crate::store::RECORD_KEEP_MS;
        let shared = sample::level_for(before, crate::store::RECORD_RATE_PERIOD_MS, max, day);
        let burst = (max / 100).max(1);
        let own = if seen > burst {
            sample::level_for(seen, 1_000, max, day)
        } else {
            0
        };
        let level = shared.max(own);
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pending.get_mut(policy)
            && p.level != level
        {
            tracing::debug!(
                policy,
                one_in = 1u64 << level,
                "the what-if record of this policy now samples one identifier in {}",
                1u64 << level
            );
            p.level = level;
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

/// What a replay runs.
pub enum Candidate {
    /// The policy in force (its own record replayed: the fidelity check).
    Current,
    /// A draft of its rules and settings, under the overrides in force (the editor; a
    /// document that does not list overrides).
    Rules(Policy),
    /// An Envoy domain's file, under the overrides in force.
    File(Policy),
    /// A whole policy, its overrides as given (a file, as an import would save it).
    Whole(Policy),
    /// A stored version, under the overrides in force: what a rollback would make it.
    Version(u64),
}

impl std::fmt::Display for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Candidate::Current => f.write_str("the policy in force"),
            Candidate::Rules(_) | Candidate::Whole(_) => f.write_str("a draft"),
            Candidate::File(_) => f.write_str("a domain file"),
            Candidate::Version(v) => write!(f, "version {v}"),
        }
    }
}

/// Refuses a look back the record cannot answer.
fn check_look_back(look_back_ms: i64) -> Result<(), WhatIfError> {
    if (1..=MAX_LOOK_BACK_MS).contains(&look_back_ms) {
        return Ok(());
    }
    Err(WhatIfError::Invalid {
        field: "last_ms",
        message: format!("must be from 1 to {MAX_LOOK_BACK_MS} (the record keeps a day)"),
    })
}

/// Replays `policy` over `record` on a blocking thread, within [`REPLAY_BUDGET`], stopping
/// when the caller goes away.
async fn replay_in_budget(policy: Policy, record: Vec<Recorded>) -> WhatIf {
    let cancel = Cancel(Arc::new(AtomicBool::new(false)));
    let stop = cancel.0.clone();
    let started = Instant::now();
    let answer = tokio::task::spawn_blocking(move || {
        replay(&policy, &record, || {
            stop.load(Ordering::Relaxed) || started.elapsed() > REPLAY_BUDGET
        })
    })
    .await;
    drop(cancel);
    // A replay that panicked answers nothing replayed, and says it is not complete.
    answer.unwrap_or_default()
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
            &checked.policy,
            at_us,
            request.cost,
            checked.decision.allowed,
            &request.identifiers,
        );
    }

    /// Notes a decided Envoy request for the record: its limited descriptors as one check,
    /// when they share one cost and none brought its own limit (else it is not recorded).
    pub(super) fn record_envoy(
        &self,
        policy: &Policy,
        plan: &crate::domain::envoy_plan::Plan,
        ok: bool,
    ) {
        let Some(cost) = plan.shared_cost() else {
            return;
        };
        let ids: Vec<Identifier> = plan.limited().cloned().collect();
        self.recorder
            .note(policy, crate::support::clock::now_us(), cost, ok, &ids);
    }

    /// Replays `draft` (a policy document; the policy in force when `None`) over `name`'s
    /// checks of the last `look_back_ms`, and says what it would have changed. A document
    /// that does not list `overrides` keeps the stored ones. Audited (`policy.what-if`).
    pub async fn what_if(
        &self,
        actor: &Actor,
        name: &Name,
        draft: Option<&serde_json::Value>,
        look_back_ms: i64,
    ) -> Result<WhatIf, WhatIfError> {
        let candidate = match draft {
            None => Candidate::Current,
            Some(doc) => {
                let policy =
                    Policy::from_document(name.as_str(), doc).map_err(WhatIfError::Draft)?;
                match doc.get("overrides") {
                    None | Some(serde_json::Value::Null) => Candidate::Rules(policy),
                    Some(_) => Candidate::Whole(policy),
                }
            }
        };
        self.what_if_policy(actor, name, candidate, look_back_ms)
            .await
    }

    /// [`Service::what_if`] of a parsed candidate (the editor's form, a file, a version).
    pub async fn what_if_policy(
        &self,
        actor: &Actor,
        name: &Name,
        candidate: Candidate,
        look_back_ms: i64,
    ) -> Result<WhatIf, WhatIfError> {
        check_look_back(look_back_ms)?;
        let current = self
            .stored_policy(name)
            .await?
            .ok_or_else(|| WhatIfError::UnknownPolicy(name.to_string()))?;
        let what = candidate.to_string();
        let mut policy = self.candidate_policy(candidate, current).await?;
        // An Envoy domain counts as it says, else as this server does.
        policy.resolve_envoy_counting(self.policies.envoy_counting());
        policy.resolve_envoy_quota(self.policies.envoy_quota_all());
        let record = self.record_since(name, look_back_ms).await?;
        let answer = replay_in_budget(policy, record).await;
        let after = serde_json::json!({
            "replayed": what,
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

    /// The policy `candidate` replays, given the one in force.
    async fn candidate_policy(
        &self,
        candidate: Candidate,
        current: Policy,
    ) -> Result<Policy, WhatIfError> {
        match candidate {
            Candidate::Current => Ok(current),
            Candidate::Rules(p) | Candidate::Whole(p)
                if current.envoy.is_some() && p.envoy.is_none() =>
            {
                Err(WhatIfError::Invalid {
                    field: "policy",
                    message: format!(
                        "{} is an Envoy domain: its limits come from its file; replay a file",
                        current.name
                    ),
                })
            }
            Candidate::Whole(policy) => Ok(policy),
            Candidate::Rules(policy) => Ok(Policy {
                overrides: current.overrides,
                ..policy
            }),
            Candidate::File(mut policy) => {
                // A file that does not say how it counts keeps the domain's setting.
                if let (Some(file), Some(now)) = (&mut policy.envoy, &current.envoy)
                    && file.counting.is_none()
                {
                    file.counting = now.counting;
                }
                Ok(Policy {
                    overrides: current.overrides,
                    failure_mode: current.failure_mode,
                    record: current.record,
                    record_checks: current.record_checks,
                    ..policy
                })
            }
            Candidate::Version(version) => {
                let old = self
                    .version_to_restore(&current.name, version)
                    .await?
                    .ok_or(WhatIfError::Invalid {
                        field: "version",
                        message: format!("{} has no version {version}", current.name),
                    })?;
                Ok(Policy {
                    overrides: current.overrides,
                    ..old
                })
            }
        }
    }

    /// `name`'s recorded checks of the last `look_back_ms`.
    async fn record_since(
        &self,
        name: &Name,
        look_back_ms: i64,
    ) -> Result<Vec<Recorded>, StoreError> {
        let since_ms = super::now_ms() - look_back_ms;
        // The stream is cut approximately (`MAXLEN ~`): read a little past the setting, so
        // the newest checks are never the ones left out.
        let max = self.record_max();
        self.store
            .recorded_checks(name.as_str(), since_ms, max + max / 10 + 1_000)
            .await
    }

    /// Suggested limits for `rule` of the policy `name` in force, from its checks of the
    /// last `look_back_ms` (see `domain::suggest`).
    pub async fn suggest_limits(
        &self,
        name: &Name,
        rule: &str,
        look_back_ms: i64,
    ) -> Result<crate::domain::suggest::Suggestion, WhatIfError> {
        check_look_back(look_back_ms)?;
        let policy = self
            .stored_policy(name)
            .await?
            .ok_or_else(|| WhatIfError::UnknownPolicy(name.to_string()))?;
        let record = self.record_since(name, look_back_ms).await?;
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

    /// Suggested limits for each rule with a window of `draft` (a draft of the policy
    /// `name`, under the overrides in force), from one read of its checks of the last
    /// `look_back_ms`; at most three rules, and none once the replay's budget is spent.
    pub async fn suggest_limits_for(
        &self,
        name: &Name,
        draft: Policy,
        look_back_ms: i64,
    ) -> Result<Vec<crate::domain::suggest::Suggestion>, WhatIfError> {
        check_look_back(look_back_ms)?;
        let current = self
            .stored_policy(name)
            .await?
            .ok_or_else(|| WhatIfError::UnknownPolicy(name.to_string()))?;
        let policy = Policy {
            overrides: current.overrides,
            ..draft
        };
        let record = self.record_since(name, look_back_ms).await?;
        let started = Instant::now();
        let answer = tokio::task::spawn_blocking(move || {
            policy
                .rules
                .iter()
                .take_while(|_| started.elapsed() < REPLAY_BUDGET)
                .filter_map(|rule| {
                    crate::domain::suggest::suggest(&policy, rule.name.as_str(), &record).ok()
                })
                .take(3)
                .collect()
        })
        .await;
        Ok(answer.unwrap_or_default())
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
