//! Optimistic concurrency: read a version, do the work, write only if the
//! version is unchanged.
//!
//! Most locks guard a read-modify-write: take the lock, read, compute,
//! write, release. When conflicts are rare, the lock is pure cost, and a
//! holder that stalls blocks everyone. Optimistic concurrency drops the
//! lock: every value carries a [`Version`], a writer states the version it
//! read, and the write succeeds only if nobody wrote in between. A loser
//! gets its value back with the current version and retries.
//!
//! - [`VersionedCell`]: one value in process. Readers never block and never
//!   wait for a writer; writers compare-and-set.
//! - [`Versioned`]: a value with its version; also a [`Merge`](crate::Merge)
//!   (the higher version wins), so versioned records travel and are tested
//!   like the CRDTs.
//! - [`RetryPolicy`]: how `update` retries after a conflict: bounded
//!   attempts, exponential backoff with full jitter. Never forever.
//!
//! The same idea across machines is the [`store`](crate::store): every key
//! has a version and writes can `Expect` one.
//!
//! # Examples
//!
//! ```
//! use calm::occ::VersionedCell;
//!
//! let balance = VersionedCell::new(100u64);
//! // Many threads could do this at once; none would block the others.
//! let v = balance.update(|b| b - 30)?;
//! assert_eq!(*balance.load().value(), 70);
//!
//! // A stale write is refused and hands the value back.
//! let conflict = balance.compare_and_set(v.prev(), 0).unwrap_err();
//! assert_eq!(conflict.current, v);
//! assert_eq!(conflict.value, 0);
//! # Ok::<(), calm::occ::RetryExhausted>(())
//! ```

mod cell;
mod retry;
mod version;

pub use cell::{Conflict, Snapshot, VersionedCell};
#[cfg(feature = "testing")]
pub(crate) use retry::seed_jitter;
pub use retry::{Attempts, RetryExhausted, RetryPolicy};
pub use version::{Version, Versioned};
