//! The store's one error type: Redis failing, not answering in time, answering something
//! the scripts' contracts do not allow, or asked what it cannot do.

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
    /// Set up wrong: a file the connection needs cannot be read.
    #[error("{0}")]
    Setup(String),
    /// What this kind of Redis cannot do (pub/sub on a cluster, a check queue without
    /// one).
    #[error("not available with this Redis: {0}")]
    Unsupported(&'static str),
    /// The server is shutting down: the check queue no longer takes checks.
    #[error("the check queue has stopped")]
    Stopped,
    /// A value could not be written as the store keeps it.
    #[error("encoding for redis: {0}")]
    Encode(String),
    /// A local rule's counter has not reached Redis for longer than its grace (ms): its
    /// flushes fail, so the policy's failure mode decides.
    #[error("redis has not been reached for {0} ms, longer than a local rule's grace")]
    NotReached(u64),
    /// The check script failed for this one check (its other checks were answered).
    #[error("the check script failed: {0}")]
    Script(String),
}

impl StoreError {
    /// Whether the call ran out of time: Redis may still run it (a write may land).
    pub fn is_timeout(&self) -> bool {
        match self {
            StoreError::Timeout(_) => true,
            StoreError::Redis(error) => error.is_timeout(),
            _ => false,
        }
    }

    /// Whether Redis could not be reached (down, refusing, not answering in time), rather
    /// than reached and wrong, or set up wrong: waiting may mend the former, never the
    /// latter.
    pub fn is_unreachable(&self) -> bool {
        match self {
            StoreError::Redis(error) => {
                error.is_io_error()
                    || error.is_connection_refusal()
                    || error.is_connection_dropped()
                    || error.is_timeout()
                    || matches!(
                        error.kind(),
                        redis::ErrorKind::Io
                            | redis::ErrorKind::ClusterConnectionNotFound
                            | redis::ErrorKind::MasterNameNotFoundBySentinel
                            | redis::ErrorKind::NoValidReplicasFoundBySentinel
                    )
            }
            StoreError::Timeout(_) | StoreError::CircuitOpen | StoreError::NotReached(_) => true,
            StoreError::Reply(_)
            | StoreError::Script(_)
            | StoreError::Setup(_)
            | StoreError::Unsupported(_)
            | StoreError::Stopped
            | StoreError::Encode(_) => false,
        }
    }
}
