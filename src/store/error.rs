//! The store's one error type: Redis failing, not answering in time, or answering
//! something the scripts' contracts do not allow.

use std::time::Duration;

/// Why a store operation did not produce an answer. A denial is never an error.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis failed repeatedly; not trying again for a moment")]
    CircuitOpen,
    #[error("unexpected reply from redis: {0}")]
    Reply(String),
    /// The check script failed for this one check (its other checks were answered).
    #[error("the check script failed: {0}")]
    Script(String),
}
