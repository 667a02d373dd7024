use super::FencingToken;
use crate::store::{LeaseId, StoreError};

/// A write was refused because a newer token has been seen.
///
/// This is the fence doing its job: the writer's grant (lock, leadership,
/// ownership, claim) was superseded while it was paused or partitioned.
/// The writer must stop and not retry with the same token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {presented}: the resource has already seen {highest}")]
#[non_exhaustive]
pub struct Fenced {
    /// The token the writer presented.
    pub presented: FencingToken,
    /// The highest token the resource had seen.
    pub highest: FencingToken,
}

impl Fenced {
    /// Builds the error (for resources that enforce tokens themselves).
    pub const fn new(presented: FencingToken, highest: FencingToken) -> Self {
        Self { presented, highest }
    }
}

/// Why a coordination recipe failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoordError {
    /// The underlying store failed (see [`StoreError::is_retryable`]).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A fenced write was refused: a newer grant exists.
    #[error(transparent)]
    Fenced(#[from] Fenced),
    /// The session's lease ended (expired, revoked, or keep-alive failed):
    /// stop acting on everything it granted.
    #[error("lease {lease} was lost: stop acting on what it granted")]
    LeaseLost {
        /// The lease.
        lease: LeaseId,
    },
    /// This process is no longer the leader (or lock holder): its key is
    /// gone or was replaced.
    #[error("no longer the leader (term with token {token} ended)")]
    NotLeader {
        /// The token of the term that ended.
        token: FencingToken,
    },
    /// The election already has as many candidates as its cap allows.
    #[error("{cap} candidates already contend; not joining")]
    TooManyCandidates {
        /// The configured cap.
        cap: usize,
    },
    /// A prefix or key is unusable (for example empty).
    #[error("invalid name: {reason}")]
    InvalidName {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An argument the operation cannot take (a savepoint where a whole
    /// transaction is needed); nothing was done.
    #[error("invalid argument: {reason}")]
    InvalidArgument {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A lease, election or lock needs a Tokio runtime for its background
    /// keep-alive, and none is running on this thread. Nothing was
    /// granted. Call it from inside a runtime.
    #[error("no Tokio runtime: a lease's keep-alive runs as a Tokio task")]
    NoRuntime,
    /// A TTL is zero or too large.
    #[error("invalid ttl: {reason}")]
    InvalidTtl {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A recorded outcome or record did not deserialize.
    #[error("stored record does not deserialize: {0}")]
    Record(#[from] serde_json::Error),
    /// An observer's watch ended (history compacted, store closed).
    #[error("observation ended")]
    ObserveEnded(#[source] StoreError),
}

impl CoordError {
    /// Whether the error means this process must stop acting on its grant
    /// (fenced, lease lost, leadership lost).
    pub fn is_lost_grant(&self) -> bool {
        matches!(
            self,
            CoordError::Fenced(_) | CoordError::LeaseLost { .. } | CoordError::NotLeader { .. }
        ) || matches!(self, CoordError::Store(e) if e.is_lease_lost())
    }

    /// Whether retrying may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, CoordError::Store(e) if e.is_retryable())
    }
}
