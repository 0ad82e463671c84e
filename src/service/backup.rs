//! A backup of what Spillway keeps without a TTL (`domain::backup`), and its restore:
//! refused over a Redis that holds anything an admin made, unless asked to replace it;
//! audited (`state.restore`).

use super::Service;
use super::audit::{Actor, Change};
use crate::domain::backup::Backup;
use crate::store::StoreError;

/// Why a restore did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("{0}: {1}")]
    Invalid(String, String),
    #[error(
        "this Redis holds {0}: a restore replaces all of it; say so (spillway restore --replace)"
    )]
    NotEmpty(String),
    #[error("redis is unavailable: {0}")]
    Unavailable(#[from] StoreError),
}

impl Service {
    /// What Redis holds now, as a backup.
    pub async fn backup(&self) -> Result<Backup, StoreError> {
        self.store.backup().await
    }

    /// Writes `backup` back, replacing what Redis holds (only when `replace` says, if it
    /// holds anything an admin made). Says what was restored.
    pub async fn restore(
        &self,
        actor: &Actor,
        backup: &Backup,
        replace: bool,
    ) -> Result<String, RestoreError> {
        backup
            .check()
            .map_err(|(field, message)| RestoreError::Invalid(field, message))?;
        let now = self.store.backup().await?;
        if !now.is_empty() && !replace {
            return Err(RestoreError::NotEmpty(now.summary()));
        }
        self.store.restore(backup, &now).await?;
        let summary = backup.summary();
        let _ = actor
            .record(
                &self.store,
                Change {
                    action: "state.restore",
                    target: "*",
                    before: now.summary(),
                    after: summary.clone(),
                    reason: "spillway restore",
                },
            )
            .await;
        Ok(summary)
    }
}
