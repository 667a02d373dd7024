use std::time::Duration;

use crate::store::BoxError;

/// Why an efficiency lock on Redis could not be taken, extended or
/// released.
///
/// A lock held by someone else is not here: [`try_acquire`] returns
/// `Ok(None)` for it, and [`acquire`] keeps waiting until its deadline
/// ([`TimedOut`](RedisLockError::TimedOut)). These are the failures: bad
/// input (fix the call), a lock this guard no longer holds (stop the
/// work), and Redis not answering (retry; see
/// [`is_retryable`](RedisLockError::is_retryable)).
///
/// Each error says only its own part; the cause is its
/// [`source`](std::error::Error::source).
///
/// [`try_acquire`]: super::RedisLock::try_acquire
/// [`acquire`]: super::RedisLock::acquire
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisLockError {
    /// The key is empty or longer than [`MAX_KEY_LEN`](super::MAX_KEY_LEN).
    /// Nothing was sent. Fix the key.
    #[error("invalid lock key of {len} bytes: {reason}")]
    InvalidKey {
        /// The key's length.
        len: usize,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The TTL is zero, above [`MAX_TTL`](super::MAX_TTL), or not longer
    /// than the clock-drift allowance. Nothing was connected. Fix the
    /// options.
    #[error("invalid lock ttl: {reason}")]
    InvalidTtl {
        /// Why it was refused.
        reason: &'static str,
    },
    /// Another option is out of range (no Redis instance, a renew
    /// fraction or drift factor outside its interval, backoff bounds in
    /// the wrong order). Nothing was connected. Fix the options.
    #[error("invalid lock options: {reason}")]
    InvalidOptions {
        /// Why they were refused.
        reason: &'static str,
    },
    /// A Redis URL could not be parsed. Nothing was connected. Fix the
    /// configuration.
    #[error("invalid redis url {url:?}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// The client library's error.
        source: BoxError,
    },
    /// No Tokio runtime runs on this thread: the connection manager and
    /// the guard's extender are Tokio tasks. Call from inside a runtime.
    #[error("no tokio runtime: redis connections and lock extenders run as tokio tasks")]
    NoRuntime,
    /// Redis refused the request, or the connection failed or broke. A
    /// `SET` whose connection broke after it was sent may or may not have
    /// been applied; the key then expires after its TTL. Retrying is safe.
    #[error("redis request failed")]
    Redis {
        /// The client library's error.
        source: BoxError,
    },
    /// Redis did not answer within the request timeout (a paused or
    /// overloaded server, a network stall). As with
    /// [`Redis`](RedisLockError::Redis), a `SET` may have been applied.
    /// Retrying is safe.
    #[error("redis did not answer within {after:?}")]
    RequestTimeout {
        /// How long the request was given.
        after: Duration,
    },
    /// Fewer [`Redlock`](super::Redlock) instances than a majority
    /// answered at all (the others failed or timed out), so the lock could
    /// be neither taken nor kept. Retry later, or bring instances back.
    /// (With one instance, its own error is returned instead.)
    #[error("only {answered} of the {needed} redis instances a majority needs answered")]
    NoQuorum {
        /// Instances that answered (yes or no).
        answered: usize,
        /// The majority: `n / 2 + 1`.
        needed: usize,
        /// The last instance's error.
        source: Option<Box<RedisLockError>>,
    },
    /// [`acquire`](super::RedisLock::acquire) did not get the lock before
    /// its deadline: someone else held it throughout, or Redis did not
    /// answer. Nothing is held (any partial grant was released or
    /// expires). Give up, or try again later.
    #[error("lock not acquired within {waited:?}")]
    TimedOut {
        /// How long it waited.
        waited: Duration,
        /// The last attempt's error, when the last attempt failed rather
        /// than found the lock held.
        source: Option<Box<RedisLockError>>,
    },
    /// The key no longer holds this guard's value: the lock expired (its
    /// holder paused or was cut off past the TTL) and may now be someone
    /// else's. Nothing was changed. Stop the work the lock was for.
    #[error("the lock is no longer held by this guard")]
    NotHeld,
}

impl RedisLockError {
    /// Whether trying again later may succeed (Redis unreachable, slow, or
    /// without a majority; a deadline passed). Bad input and a lock that
    /// is no longer held are not retryable.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            RedisLockError::Redis { .. }
                | RedisLockError::RequestTimeout { .. }
                | RedisLockError::NoQuorum { .. }
                | RedisLockError::TimedOut { .. }
        )
    }

    /// Whether this is [`NotHeld`](RedisLockError::NotHeld): the guard's
    /// lock is gone.
    pub fn is_not_held(&self) -> bool {
        matches!(self, RedisLockError::NotHeld)
    }

    /// Whether a deadline passed: a request's
    /// ([`RequestTimeout`](RedisLockError::RequestTimeout)) or
    /// `acquire`'s ([`TimedOut`](RedisLockError::TimedOut)).
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            RedisLockError::RequestTimeout { .. } | RedisLockError::TimedOut { .. }
        )
    }

    pub(super) fn redis(e: redis::RedisError) -> Self {
        RedisLockError::Redis {
            source: Box::new(e),
        }
    }
}
