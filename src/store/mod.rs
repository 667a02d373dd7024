//! A key-value store with etcd's model, the ground every coordination
//! recipe in calm stands on.
//!
//! One model on every backend ([`MemoryStore`] embedded, PostgreSQL and
//! etcd behind features), so each recipe is written once and every backend
//! passes the same conformance suite:
//!
//! - a store-wide **revision** that grows by one with every write (a
//!   transaction's writes share one revision). Each key records
//!   `create_revision`, `mod_revision` and a write count ([`KeyValue`]).
//!   Because revisions only grow, a key's revision is also a **fencing
//!   token**;
//! - [`get`](Store::get), [`range`](Store::range), [`put`](Store::put) and
//!   [`delete`](Store::delete) with an [`Expect`] (`Any`, `Absent`,
//!   `Version(v)`) for compare-and-set, and [`txn`](Store::txn): compares,
//!   then writes, all or nothing;
//! - **leases** whose expiry is judged by the store's clock, never the
//!   holder's: [`grant`](Store::grant), [`keep_alive`](Store::keep_alive),
//!   [`revoke`](Store::revoke); keys attached to a lease vanish, at one
//!   revision, when it ends;
//! - [`watch`](Store::watch) from a revision: every put and delete in
//!   order, none missed or repeated, or a typed
//!   [`Compacted`](StoreError::Compacted) error if that history is gone.
//!
//! On top: [`StoreExt::merge_into`] folds any [`Merge`](crate::Merge) value
//! into a key (read, merge, compare-and-set, repeat: no update is lost and
//! no conflict reaches the caller), and [`Typed`] stores serde values with
//! an optimistic [`update`](Typed::update).
//!
//! # Examples
//!
//! ```
//! use calm::store::{Expect, MemoryStore, PutOptions, Store, WriteOutcome};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), calm::store::StoreError> {
//! let store = MemoryStore::new();
//! let first = store.put(b"config", b"v1", PutOptions::new()).await?;
//! let read = store.get(b"config").await?.expect("just written");
//!
//! // A write that expects the version we read succeeds...
//! let ok = store
//!     .put(b"config", b"v2", PutOptions::new().with_expect(Expect::Version(read.mod_revision)))
//!     .await?;
//! assert!(ok.committed().is_some());
//! // ...and a second one with the same, now stale, version does not.
//! let stale = store
//!     .put(b"config", b"v3", PutOptions::new().with_expect(Expect::Version(read.mod_revision)))
//!     .await?;
//! assert!(matches!(stale, WriteOutcome::Conflict { .. }));
//! assert_eq!(store.get(b"config").await?.unwrap().value, b"v2");
//! # let _ = first;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

use crate::occ::Version;

mod clock;
mod error;
mod ext;
mod memory;
mod polled;
mod typed;
mod types;

pub use clock::{Clock, ManualClock, Sleep, SystemClock};
pub use error::{BoxError, StoreError, StoredFormat};
pub use ext::{MERGE_RETRY, StoreExt};
pub use memory::{MemoryStore, MemoryStoreOptions, MemoryWatch};
pub(crate) use polled::{History, PolledWatch};
pub use typed::{Entry, Typed, TypedEvent, TypedWatch, UpdateError, Updated};
#[cfg(any(feature = "postgres", feature = "etcd"))]
pub(crate) use types::prefix_end;
pub use types::{
    Compare, CompareOp, CompareTarget, EventKind, Expect, KeySpan, KeyValue, LeaseGrant, LeaseId,
    MAX_KEY_LEN, MAX_LEASE_TTL, MAX_TXN_BYTES, MAX_TXN_OPS, MAX_VALUE_LEN, PutOptions, RangeResult,
    Txn, TxnOp, TxnOpResult, TxnOutcome, WatchEvent, WriteOutcome, check_key, check_lease,
    check_prefix, check_ttl, check_value,
};

/// A key-value store with etcd's model: revisions, compare-and-set,
/// transactions, leases and watches.
///
/// Every method returns a `Send` future. Read the `# Cancel safety` of each
/// before using it in `select!`: reads are always safe to drop; a dropped
/// write on a remote backend may or may not have been applied, possibly
/// later than a read you make next (see [`Store::put`] for how a
/// conditional rewrite settles it).
pub trait Store: Send + Sync {
    /// The stream a [`watch`](Store::watch) returns.
    type Watch: Watch;

    /// The store's current revision.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    fn revision(&self) -> impl Future<Output = Result<Version, StoreError>> + Send;

    /// Reads one key.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidKey`], or a backend failure.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    fn get(&self, key: &[u8]) -> impl Future<Output = Result<Option<KeyValue>, StoreError>> + Send;

    /// Reads every key starting with `prefix`, in key order, at most
    /// `limit` of them (`more` says if there were more).
    ///
    /// # Errors
    ///
    /// A backend failure. An empty prefix reads every key.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    fn range(
        &self,
        prefix: &[u8],
        limit: Option<usize>,
    ) -> impl Future<Output = Result<RangeResult, StoreError>> + Send;

    /// Writes one key if `options.expect` holds, optionally attached to a
    /// lease.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidKey`], [`StoreError::ValueTooLarge`],
    /// [`StoreError::LeaseNotFound`] if the lease is not alive, or a
    /// backend failure. A lost compare-and-set is
    /// [`WriteOutcome::Conflict`], not an error.
    ///
    /// # Cancel safety
    ///
    /// On [`MemoryStore`], cancel safe (the write happens in one step at
    /// the first poll or not at all). On a remote backend, a future dropped
    /// after the request left may still be applied **later**, even after a
    /// read of yours saw it not applied (the request can still be queued
    /// on a connection or in the server). A read cannot settle it; a write
    /// can: make the write conditional ([`Expect::Version`] or
    /// [`Expect::Absent`]) and, after dropping it, write the key again
    /// under the same expectation. Once that second write commits, the
    /// first can never apply (its expectation no longer holds); if the
    /// second conflicts, read the key: the first one (or someone else)
    /// wrote. An unconditional put has no such guarantee.
    ///
    /// # Examples
    ///
    /// Compare-and-set: write only if nobody wrote since the read.
    ///
    /// ```
    /// use calm::store::{Expect, MemoryStore, PutOptions, Store, WriteOutcome};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::store::StoreError> {
    /// let store = MemoryStore::new();
    /// let first = store.put(b"balance", b"100", PutOptions::new()).await?;
    /// let seen = first.committed().expect("an unconditional put commits");
    /// // Someone else writes in between...
    /// let _ = store.put(b"balance", b"90", PutOptions::new()).await?;
    /// // ...so a write that expects the version we read is refused.
    /// let late = store
    ///     .put(b"balance", b"150", PutOptions::new().with_expect(Expect::Version(seen)))
    ///     .await?;
    /// assert!(matches!(late, WriteOutcome::Conflict { current: Some(_) }));
    /// # Ok(())
    /// # }
    /// ```
    fn put(
        &self,
        key: &[u8],
        value: &[u8],
        options: PutOptions,
    ) -> impl Future<Output = Result<WriteOutcome, StoreError>> + Send;

    /// Deletes one key if `expect` holds. Deleting an absent key with
    /// [`Expect::Any`] commits and changes nothing.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidKey`] or a backend failure.
    ///
    /// # Cancel safety
    ///
    /// As [`put`](Store::put).
    fn delete(
        &self,
        key: &[u8],
        expect: Expect,
    ) -> impl Future<Output = Result<WriteOutcome, StoreError>> + Send;

    /// Runs a transaction: all of its writes at one revision, or none.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidTxn`] (a key written twice in a branch),
    /// invalid keys or values, [`StoreError::LeaseNotFound`], or a backend
    /// failure; in every case nothing was written.
    ///
    /// # Cancel safety
    ///
    /// As [`put`](Store::put): atomic either way, but a remote transaction
    /// dropped in flight may or may not have committed.
    ///
    /// # Examples
    ///
    /// Move an amount between two keys only if neither changed since read.
    ///
    /// ```
    /// use calm::store::{Compare, CompareOp, MemoryStore, PutOptions, Store, Txn, TxnOp};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::store::StoreError> {
    /// let store = MemoryStore::new();
    /// let a = store.put(b"a", b"10", PutOptions::new()).await?.committed().unwrap();
    /// let b = store.put(b"b", b"0", PutOptions::new()).await?.committed().unwrap();
    /// let out = store
    ///     .txn(
    ///         Txn::new()
    ///             .when(Compare::mod_revision(b"a", CompareOp::Equal, a))
    ///             .when(Compare::mod_revision(b"b", CompareOp::Equal, b))
    ///             .then(TxnOp::put(b"a", b"7"))
    ///             .then(TxnOp::put(b"b", b"3")),
    ///     )
    ///     .await?;
    /// assert!(out.succeeded);
    /// assert_eq!(store.get(b"b").await?.map(|kv| kv.value), Some(b"3".to_vec()));
    /// # Ok(())
    /// # }
    /// ```
    fn txn(&self, txn: Txn) -> impl Future<Output = Result<TxnOutcome, StoreError>> + Send;

    /// Grants a lease that ends `ttl` after its last keep-alive, by the
    /// store's clock.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidTtl`] for a zero TTL, or a backend failure.
    ///
    /// # Cancel safety
    ///
    /// A grant dropped in flight may leave a lease nobody knows about; it
    /// expires on its own after `ttl`.
    fn grant(&self, ttl: Duration) -> impl Future<Output = Result<LeaseGrant, StoreError>> + Send;

    /// Renews a lease for another full TTL; returns the TTL.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseNotFound`] if it already ended: the holder must
    /// stop acting on it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a renewal dropped in flight may or may not have
    /// renewed, which only moves the expiry later.
    fn keep_alive(
        &self,
        lease: LeaseId,
    ) -> impl Future<Output = Result<Duration, StoreError>> + Send;

    /// Ends a lease now, deleting its keys at one revision.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseNotFound`] if it already ended.
    ///
    /// # Cancel safety
    ///
    /// A revoke dropped in flight may or may not have happened; the lease
    /// ends by its TTL anyway.
    fn revoke(&self, lease: LeaseId) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// How long a lease has left.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseNotFound`] if it ended.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    fn time_to_live(
        &self,
        lease: LeaseId,
    ) -> impl Future<Output = Result<Duration, StoreError>> + Send;

    /// Drops the history of changes up to and including `revision` (capped
    /// at the current revision): watches can no longer start there, and
    /// one that tries fails with [`StoreError::Compacted`] naming
    /// `revision + 1` as the first revision kept. Current keys are
    /// untouched. (etcd cannot compact past its current revision: there,
    /// compacting at the current revision keeps that revision readable.)
    ///
    /// # Errors
    ///
    /// A backend failure.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: compacting is idempotent.
    fn compact(&self, revision: Version) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Watches keys from revision `from` (inclusive; [`Version::ZERO`]
    /// means "from the next write").
    ///
    /// # Errors
    ///
    /// [`StoreError::Compacted`] if `from` is older than the history kept.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it before it returns starts no watch.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::occ::Version;
    /// use calm::store::{EventKind, KeySpan, MemoryStore, PutOptions, Store, Watch};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::store::StoreError> {
    /// let store = MemoryStore::new();
    /// // From the next revision on (Version::ZERO), every change under "jobs/".
    /// let mut watch = store.watch(KeySpan::Prefix(b"jobs/".to_vec()), Version::ZERO).await?;
    /// let _ = store.put(b"jobs/1", b"queued", PutOptions::new()).await?;
    /// let event = watch.next().await?;
    /// assert_eq!((event.kind, event.kv.key.as_slice()), (EventKind::Put, &b"jobs/1"[..]));
    /// # Ok(())
    /// # }
    /// ```
    fn watch(
        &self,
        span: KeySpan,
        from: Version,
    ) -> impl Future<Output = Result<Self::Watch, StoreError>> + Send;
}

/// An ordered stream of changes from a [`Store::watch`].
///
/// Events come in revision order, each exactly once. The stream never ends
/// silently: when it cannot go on (history compacted under a slow reader,
/// connection lost, store closed) [`next`](Watch::next) returns the error.
pub trait Watch: Send {
    /// The next change.
    ///
    /// # Errors
    ///
    /// [`StoreError::Compacted`] if the reader fell behind the history
    /// kept, or a backend failure; the watch is then over.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an event is consumed only when `next` returns it.
    fn next(&mut self) -> impl Future<Output = Result<WatchEvent, StoreError>> + Send;
}
