//! What every store gets for free: merging CRDTs into keys, and typed
//! values with optimistic updates.

use std::future::Future;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Expect, PutOptions, Store, StoreError, WriteOutcome};
use crate::codec::{self, Tagged};
use crate::merge::Merge;
use crate::occ::{RetryExhausted, RetryPolicy, Version, Versioned};

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
            for attempt in 0..MERGE_RETRY.max_attempts() {
                let current = self.get(key).await?;
                let (mut value, expect) = match &current {
                    Some(kv) => (
                        codec::from_bytes::<M>(&kv.value)?,
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
                    WriteOutcome::Conflict { .. } => MERGE_RETRY.sleep(attempt).await,
                }
            }
            Err(StoreError::Contention(RetryExhausted {
                attempts: MERGE_RETRY.max_attempts(),
            }))
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
                Some(kv) => Ok(Some(codec::from_bytes(&kv.value)?)),
                None => Ok(None),
            }
        }
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

/// A view of a store whose values are `T`, stored as JSON via serde.
///
/// Values come back as [`Versioned<T>`]: the value with its
/// `mod_revision`, ready for a compare-and-set.
///
/// # Examples
///
/// ```
/// use calm::store::{MemoryStore, Typed};
///
/// #[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq)]
/// struct Account { balance: i64 }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), calm::store::StoreError> {
/// let accounts = Typed::<_, Account>::new(MemoryStore::new());
/// accounts.update(b"alice", |a| Account { balance: a.map_or(0, |a| a.balance) + 50 }).await?;
/// accounts.update(b"alice", |a| Account { balance: a.map_or(0, |a| a.balance) - 20 }).await?;
/// assert_eq!(accounts.get(b"alice").await?.unwrap().value().balance, 30);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Typed<S, T> {
    /// The underlying store.
    store: S,
    /// The policy of [`Typed::update`].
    retry: RetryPolicy,
    _value: PhantomData<fn() -> T>,
}

impl<S: Store, T: Serialize + DeserializeOwned + Send + Sync> Typed<S, T> {
    /// Wraps a store; `update` retries under [`RetryPolicy::default`].
    pub fn new(store: S) -> Self {
        Self {
            store,
            retry: RetryPolicy::default(),
            _value: PhantomData,
        }
    }

    /// Sets the policy of [`Typed::update`].
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The underlying store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Reads a value with its version.
    ///
    /// # Errors
    ///
    /// [`StoreError::Serde`] if the stored bytes are not a `T`, or a
    /// backend failure.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Versioned<T>>, StoreError> {
        match self.store.get(key).await? {
            Some(kv) => Ok(Some(Versioned::new(
                kv.mod_revision,
                serde_json::from_slice(&kv.value)?,
            ))),
            None => Ok(None),
        }
    }

    /// Writes a value if `expect` holds.
    ///
    /// # Errors
    ///
    /// As [`Store::put`], plus [`StoreError::Serde`].
    ///
    /// # Cancel safety
    ///
    /// As [`Store::put`].
    pub async fn put(
        &self,
        key: &[u8],
        value: &T,
        expect: Expect,
    ) -> Result<WriteOutcome, StoreError> {
        let bytes = serde_json::to_vec(value)?;
        self.store
            .put(key, &bytes, PutOptions::new().with_expect(expect))
            .await
    }

    /// Optimistic read-modify-write: reads the value (or `None`), computes
    /// `f`, writes it if nobody wrote in between, else retries with
    /// jittered backoff. Returns the new version.
    ///
    /// `f` may run once per attempt: keep it free of side effects.
    ///
    /// # Errors
    ///
    /// [`StoreError::Contention`] when every attempt conflicted (nothing
    /// was written), [`StoreError::Serde`], or a backend failure.
    ///
    /// # Cancel safety
    ///
    /// Safe to drop: each attempt is one conditional write, applied whole
    /// or not at all; on a remote backend a write dropped in flight may
    /// have been applied, which a re-read shows.
    pub async fn update(
        &self,
        key: &[u8],
        mut f: impl FnMut(Option<&T>) -> T + Send,
    ) -> Result<Version, StoreError> {
        for attempt in 0..self.retry.max_attempts() {
            let current = self.get(key).await?;
            let expect = current
                .as_ref()
                .map_or(Expect::Absent, |v| Expect::Version(v.version()));
            let next = f(current.as_ref().map(Versioned::value));
            match self.put(key, &next, expect).await? {
                WriteOutcome::Committed { revision, .. } => return Ok(revision),
                WriteOutcome::Conflict { .. } => self.retry.sleep(attempt).await,
            }
        }
        Err(StoreError::Contention(RetryExhausted {
            attempts: self.retry.max_attempts(),
        }))
    }
}
