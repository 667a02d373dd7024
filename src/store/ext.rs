//! What every store gets for free: merging CRDTs into keys.

use std::future::Future;

use super::{Expect, PutOptions, Store, StoreError, WriteOutcome};
use crate::codec::{self, Tagged};
use crate::merge::Merge;
use crate::occ::{RetryPolicy, Version};

/// The policy of [`StoreExt::merge_into`]: 64 attempts, backoff from 1 ms
/// doubling to 100 ms with full jitter. A merge never conflicts
/// semantically, so it is worth being patient.
pub const MERGE_RETRY: RetryPolicy = RetryPolicy::in_process()
    .with_max_attempts(64)
    .with_initial_backoff(std::time::Duration::from_millis(1))
    .with_max_backoff(std::time::Duration::from_millis(100));

/// Methods every [`Store`] gets.
pub trait StoreExt: Store {
    /// Folds `delta` into the CRDT stored under `key` (absent counts as
    /// `M::default()`): read, merge, compare-and-set, and on conflict retry
    /// under [`MERGE_RETRY`]. Concurrent callers never lose each other's
    /// updates and never see a conflict. Returns the key's revision after
    /// the merge (unchanged if the key already included `delta`).
    ///
    /// The value is stored in calm's [`codec`](crate::codec).
    ///
    /// # Errors
    ///
    /// [`StoreError::Decode`] if the key holds something else,
    /// [`StoreError::Contention`] if all 64 attempts conflicted (nothing of
    /// this call was written; retrying is safe), or a backend failure.
    ///
    /// # Cancel safety
    ///
    /// Safe to drop: each attempt is one conditional write, so a dropped
    /// call has merged `delta` once or not at all. Merging the same delta
    /// again is harmless (merge is idempotent).
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::causal::ReplicaId;
    /// use calm::store::{MemoryStore, StoreExt};
    /// use calm::GCounter;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::store::StoreError> {
    /// let store = MemoryStore::new();
    /// for r in 1..=3 {
    ///     let mut delta = GCounter::new();
    ///     delta.increment(ReplicaId::new(r), 10);
    ///     store.merge_into(b"visits", &delta).await?;
    /// }
    /// let total: GCounter = store.read_merged(b"visits").await?.unwrap_or_default();
    /// assert_eq!(total.value(), 30);
    /// # Ok(())
    /// # }
    /// ```
    fn merge_into<M>(
        &self,
        key: &[u8],
        delta: &M,
    ) -> impl Future<Output = Result<Version, StoreError>> + Send
    where
        M: Merge + Tagged + Default + Send + Sync,
    {
        async move {
            let mut attempts = MERGE_RETRY.start();
            loop {
                let current = self.get(key).await?;
                let (mut value, expect) = match &current {
                    Some(kv) => (
                        codec::from_bytes::<M>(&kv.value)
                            .map_err(|e| StoreError::from_codec(&kv.value, e))?,
                        Expect::Version(kv.mod_revision),
                    ),
                    None => (M::default(), Expect::Absent),
                };
                value.merge(delta);
                let bytes = codec::to_bytes(&value);
                if let Some(kv) = &current {
                    if kv.value == bytes {
                        return Ok(kv.mod_revision);
                    }
                }
                match self
                    .put(key, &bytes, PutOptions::new().with_expect(expect))
                    .await?
                {
                    WriteOutcome::Committed { revision, .. } => return Ok(revision),
                    WriteOutcome::Conflict { .. } => attempts.retry().await?,
                }
            }
        }
    }

    /// Reads and decodes the CRDT stored under `key` by
    /// [`merge_into`](StoreExt::merge_into).
    ///
    /// # Errors
    ///
    /// [`StoreError::Decode`] if the key holds something else, or a
    /// backend failure.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    fn read_merged<M>(
        &self,
        key: &[u8],
    ) -> impl Future<Output = Result<Option<M>, StoreError>> + Send
    where
        M: Tagged + Send,
    {
        async move {
            match self.get(key).await? {
                Some(kv) => Ok(Some(
                    codec::from_bytes(&kv.value)
                        .map_err(|e| StoreError::from_codec(&kv.value, e))?,
                )),
                None => Ok(None),
            }
        }
    }
}

impl<S: Store + ?Sized> StoreExt for S {}
