use std::error::Error as StdError;

use super::LeaseId;
use crate::codec::DecodeError;
use crate::occ::{RetryExhausted, Version};

/// A boxed error from a backend's client library.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Why a store operation failed.
///
/// A lost compare-and-set is not here: it is the expected outcome
/// [`WriteOutcome::Conflict`](super::WriteOutcome::Conflict). These are the
/// failures: bad input (fix the call), a lease that is gone (stop acting on
/// it), history that was compacted (re-read and re-watch), and an
/// unreachable backend (retry; see [`StoreError::is_retryable`]).
///
/// Each error in a chain says only its own part: the cause is its
/// [`source`](std::error::Error::source), not repeated in its message, so
/// a reporter that walks the chain (`anyhow`'s `{:#}`, `tracing`'s error
/// fields) shows each cause once.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The key is empty or longer than [`MAX_KEY_LEN`](super::MAX_KEY_LEN).
    /// Nothing was done. Fix the key.
    #[error("invalid key of {len} bytes: {reason}")]
    InvalidKey {
        /// The key's length.
        len: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The value is larger than [`MAX_VALUE_LEN`](super::MAX_VALUE_LEN).
    /// Nothing was done.
    #[error("value of {len} bytes exceeds the limit of {max}")]
    ValueTooLarge {
        /// The value's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The transaction is malformed (for example it writes one key twice).
    /// Nothing was done.
    #[error("invalid transaction: {reason}")]
    InvalidTxn {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A lease TTL of zero or beyond what the backend supports.
    #[error("invalid lease ttl: {reason}")]
    InvalidTtl {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The lease is not alive: it expired, was revoked, or was never
    /// granted. Whoever held it must stop acting on it.
    #[error("lease {lease} not found: expired, revoked or never granted")]
    LeaseNotFound {
        /// The lease asked for.
        lease: LeaseId,
    },
    /// A watch asked for history the store no longer keeps. Re-read the
    /// current state and watch from its revision.
    #[error("revision {requested} is compacted (history kept from {first_kept})")]
    Compacted {
        /// The revision asked for.
        requested: Version,
        /// The oldest revision still available.
        first_kept: Version,
    },
    /// A read-merge-write ([`StoreExt::merge_into`](super::StoreExt::merge_into))
    /// or another optimistic loop kept conflicting. Nothing was written by
    /// the failed attempts; retrying later is safe.
    #[error(transparent)]
    Contention(#[from] RetryExhausted),
    /// A stored value did not decode as the type asked for (another program
    /// wrote the key, or it holds another type).
    #[error("stored value under the key does not decode")]
    Decode(#[from] DecodeError),
    /// A stored value did not deserialize (typed wrapper).
    #[error("stored value under the key does not deserialize")]
    Serde(#[from] serde_json::Error),
    /// A stored value is in calm's other format: JSON text where calm's
    /// binary codec was expected, or the reverse. [`Typed`](super::Typed)
    /// writes and reads JSON; [`StoreExt::merge_into`](super::StoreExt::merge_into)
    /// and [`StoreExt::read_merged`](super::StoreExt::read_merged) the
    /// codec. Read the key with the API that wrote it.
    #[error("stored value is {found}, but was read as {expected}")]
    WrongFormat {
        /// The format the bytes are in.
        found: StoredFormat,
        /// The format the reader asked for.
        expected: StoredFormat,
    },
    /// The backend could not be reached or the connection broke before the
    /// request was sent, or the request is known not to have been applied.
    /// Retrying is safe.
    #[error("backend unavailable")]
    Unavailable {
        /// The client library's error.
        source: BoxError,
    },
    /// The connection broke after a write was sent: it may or may not have
    /// been applied. Re-read the key (its version says which), or make the
    /// write idempotent.
    #[error("outcome unknown: the write may have been applied")]
    Indeterminate {
        /// The client library's error.
        source: BoxError,
    },
    /// A backend endpoint is not usable as given (not a URL, or none at
    /// all). Nothing was connected. Fix the configuration.
    #[error("invalid endpoint {endpoint:?}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it was refused.
        source: BoxError,
    },
    /// The store handle was closed (pool shut down, watch ended with its
    /// store). Create a new one.
    #[error("store closed")]
    Closed,
    /// Any other backend failure, with the client library's error.
    #[error("backend error")]
    Backend {
        /// The client library's error.
        source: BoxError,
    },
}

/// The two formats calm stores values in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoredFormat {
    /// JSON text, as [`Typed`](super::Typed) writes it.
    Json,
    /// calm's binary codec ([`codec`](crate::codec)), as
    /// [`StoreExt::merge_into`](super::StoreExt::merge_into) writes it.
    Codec,
}

impl std::fmt::Display for StoredFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoredFormat::Json => "JSON text (as Typed writes it)",
            StoredFormat::Codec => "calm's binary codec (as merge_into writes it)",
        })
    }
}

impl StoreError {
    /// The error for stored bytes that did not decode with calm's codec:
    /// [`StoreError::WrongFormat`] if they are JSON, else the decode error.
    pub(crate) fn from_codec(bytes: &[u8], e: DecodeError) -> Self {
        if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok() {
            StoreError::WrongFormat {
                found: StoredFormat::Json,
                expected: StoredFormat::Codec,
            }
        } else {
            StoreError::Decode(e)
        }
    }

    /// The error for stored bytes that did not deserialize as JSON:
    /// [`StoreError::WrongFormat`] if they start with calm's codec header,
    /// else the JSON error.
    pub(crate) fn from_json(bytes: &[u8], e: serde_json::Error) -> Self {
        if bytes.len() >= 2
            && (crate::codec::OLDEST_FORMAT_VERSION..=crate::codec::FORMAT_VERSION)
                .contains(&bytes[0])
        {
            StoreError::WrongFormat {
                found: StoredFormat::Codec,
                expected: StoredFormat::Json,
            }
        } else {
            StoreError::Serde(e)
        }
    }

    /// Whether retrying the same call may succeed (the backend was
    /// unreachable, or an optimistic loop ran out of attempts).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable { .. }
                | StoreError::Contention(_)
                | StoreError::Indeterminate { .. }
        )
    }

    /// Whether the error means a lease is gone (its holder must stop).
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, StoreError::LeaseNotFound { .. })
    }
}
