//! Typed values: serde in and out of a store, with optimistic updates that
//! can decline or fail.

use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{EventKind, Expect, KeySpan, PutOptions, Store, StoreError, Watch, WriteOutcome};
use crate::occ::{RetryPolicy, Version, Versioned};

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
    /// The policy of [`Typed::update`] and [`Typed::try_update`].
    retry: RetryPolicy,
    _value: PhantomData<fn() -> T>,
}

/// What an optimistic update did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "an update may have declined to write; check `written`"]
pub struct Updated {
    /// The key's version after the call: the one written, or, when the
    /// closure declined, the one it was shown (`None`: the key was absent).
    pub version: Option<Version>,
    /// Whether a new value was written.
    pub written: bool,
    /// Attempts made (1 when nobody else wrote in between).
    pub attempts: u32,
}

/// Why a fallible update ([`Typed::try_update`]) did not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpdateError<E> {
    /// The closure refused the update with the caller's error. Nothing was
    /// written.
    #[error("update refused: {0}")]
    Refused(E),
    /// The store failed (contention past the retry policy included).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One change seen by a [`TypedWatch`].
#[derive(Debug, Clone, PartialEq)]
pub enum TypedEvent<T> {
    /// The key now holds this value.
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value and its version.
        value: Versioned<T>,
    },
    /// The key was deleted at this revision.
    Delete {
        /// The key.
        key: Vec<u8>,
        /// The revision of the delete.
        revision: Version,
    },
}

/// A key and its typed value, from [`Typed::range`].
#[derive(Debug, Clone, PartialEq)]
pub struct Entry<T> {
    /// The key.
    pub key: Vec<u8>,
    /// The value and its version.
    pub value: Versioned<T>,
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::from_json(bytes, e))
}

impl<S: Store, T: Serialize + DeserializeOwned + Send + Sync> Typed<S, T> {
    /// Wraps a store; updates retry under [`RetryPolicy::default`].
    pub fn new(store: S) -> Self {
        Self {
            store,
            retry: RetryPolicy::default(),
            _value: PhantomData,
        }
    }

    /// Sets the policy of [`Typed::update`] and [`Typed::try_update`].
    #[must_use = "the builder returns the configured value"]
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
            Some(kv) => Ok(Some(Versioned::new(kv.mod_revision, decode(&kv.value)?))),
            None => Ok(None),
        }
    }

    /// Reads every key starting with `prefix`, in key order, at most
    /// `limit` of them.
    ///
    /// # Errors
    ///
    /// [`StoreError::Serde`] if a stored value is not a `T`, or a backend
    /// failure.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::store::{Expect, MemoryStore, Typed};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::store::StoreError> {
    /// let prices = Typed::<_, u32>::new(MemoryStore::new());
    /// prices.put(b"price/apple", &3, Expect::Any).await?;
    /// prices.put(b"price/pear", &4, Expect::Any).await?;
    /// let all = prices.range(b"price/", None).await?;
    /// assert_eq!(all.iter().map(|e| *e.value.value()).collect::<Vec<_>>(), [3, 4]);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn range(
        &self,
        prefix: &[u8],
        limit: Option<usize>,
    ) -> Result<Vec<Entry<T>>, StoreError> {
        let r = self.store.range(prefix, limit).await?;
        r.kvs
            .into_iter()
            .map(|kv| {
                Ok(Entry {
                    value: Versioned::new(kv.mod_revision, decode(&kv.value)?),
                    key: kv.key,
                })
            })
            .collect()
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

    /// Deletes a key if `expect` holds.
    ///
    /// # Errors
    ///
    /// As [`Store::delete`].
    ///
    /// # Cancel safety
    ///
    /// As [`Store::delete`].
    pub async fn delete(&self, key: &[u8], expect: Expect) -> Result<WriteOutcome, StoreError> {
        self.store.delete(key, expect).await
    }

    /// Watches typed values (see [`Store::watch`]).
    ///
    /// # Errors
    ///
    /// As [`Store::watch`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it before it returns starts no watch.
    pub async fn watch(
        &self,
        span: KeySpan,
        from: Version,
    ) -> Result<TypedWatch<S::Watch, T>, StoreError> {
        Ok(TypedWatch {
            inner: self.store.watch(span, from).await?,
            _value: PhantomData,
        })
    }

    /// Optimistic read-modify-write: reads the value (or `None`), computes
    /// `f`, writes it if nobody wrote in between, else retries under the
    /// policy (jittered backoff, bounded in attempts and time).
    ///
    /// `f` may run once per attempt: keep it free of side effects. To
    /// refuse an update (an overdraft), use [`try_update`](Self::try_update).
    ///
    /// # Errors
    ///
    /// [`StoreError::Contention`] when the policy ran out (nothing was
    /// written), [`StoreError::Serde`], or a backend failure.
    ///
    /// # Cancel safety
    ///
    /// Safe to drop: each attempt is one conditional write, applied whole
    /// or not at all; on a remote backend a write dropped in flight may
    /// still be applied later, but only over the version it read, never
    /// over a newer value.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::store::{MemoryStore, Typed};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::store::StoreError> {
    /// let hits = Typed::<_, u64>::new(MemoryStore::new());
    /// // Read, compute, write if unchanged; retried on conflict.
    /// let done = hits.update(b"page/home", |n| n.copied().unwrap_or(0) + 1).await?;
    /// assert!(done.written);
    /// let _ = hits.update(b"page/home", |n| n.copied().unwrap_or(0) + 1).await?;
    /// assert_eq!(hits.get(b"page/home").await?.map(|v| *v.value()), Some(2));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn update(
        &self,
        key: &[u8],
        mut f: impl FnMut(Option<&T>) -> T + Send,
    ) -> Result<Updated, StoreError> {
        self.try_update(key, |current| {
            Ok::<_, std::convert::Infallible>(Some(f(current)))
        })
        .await
        .map_err(|e| match e {
            UpdateError::Store(e) => e,
            UpdateError::Refused(never) => match never {},
        })
    }

    /// A read-modify-write that can say no: `f` sees the current value and
    /// returns `Ok(Some(new))` to write it, `Ok(None)` to leave the key as
    /// it is, or `Err(e)` to abort with your own error. Conflicts retry as
    /// in [`update`](Self::update), calling `f` again on the newer value.
    ///
    /// # Errors
    ///
    /// [`UpdateError::Refused`] with `f`'s error (nothing written), or
    /// [`UpdateError::Store`].
    ///
    /// # Cancel safety
    ///
    /// As [`update`](Self::update).
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::store::{MemoryStore, Typed, UpdateError};
    ///
    /// #[derive(Debug, PartialEq)]
    /// struct Overdraft { balance: i64 }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::store::StoreError> {
    /// let balances = Typed::<_, i64>::new(MemoryStore::new());
    /// balances.update(b"alice", |b| b.copied().unwrap_or(0) + 30).await?;
    /// let withdraw = |amount: i64| move |b: Option<&i64>| {
    ///     let balance = b.copied().unwrap_or(0);
    ///     if balance < amount {
    ///         return Err(Overdraft { balance });
    ///     }
    ///     Ok(Some(balance - amount))
    /// };
    /// assert!(balances.try_update(b"alice", withdraw(20)).await.is_ok());
    /// match balances.try_update(b"alice", withdraw(20)).await {
    ///     Err(UpdateError::Refused(e)) => assert_eq!(e, Overdraft { balance: 10 }),
    ///     other => panic!("{other:?}"),
    /// }
    /// assert_eq!(*balances.get(b"alice").await?.unwrap().value(), 10);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_update<E>(
        &self,
        key: &[u8],
        mut f: impl FnMut(Option<&T>) -> Result<Option<T>, E> + Send,
    ) -> Result<Updated, UpdateError<E>> {
        let mut attempts = self.retry.start();
        loop {
            let current = self.get(key).await?;
            let expect = current
                .as_ref()
                .map_or(Expect::Absent, |v| Expect::Version(v.version()));
            let Some(next) =
                f(current.as_ref().map(Versioned::value)).map_err(UpdateError::Refused)?
            else {
                return Ok(Updated {
                    version: current.map(|v| v.version()),
                    written: false,
                    attempts: attempts.made(),
                });
            };
            match self.put(key, &next, expect).await? {
                WriteOutcome::Committed { revision, .. } => {
                    return Ok(Updated {
                        version: Some(revision),
                        written: true,
                        attempts: attempts.made(),
                    });
                }
                WriteOutcome::Conflict { .. } => {
                    attempts.retry().await.map_err(StoreError::Contention)?;
                }
            }
        }
    }
}

/// A watch of typed values, from [`Typed::watch`].
#[derive(Debug)]
pub struct TypedWatch<W, T> {
    inner: W,
    _value: PhantomData<fn() -> T>,
}

impl<W: Watch, T: DeserializeOwned> TypedWatch<W, T> {
    /// The next change, decoded.
    ///
    /// # Errors
    ///
    /// As [`Watch::next`], plus [`StoreError::Serde`] for a value that is
    /// not a `T` (the watch goes on after it).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Watch::next`].
    pub async fn next(&mut self) -> Result<TypedEvent<T>, StoreError> {
        let e = self.inner.next().await?;
        Ok(match e.kind {
            EventKind::Put => TypedEvent::Put {
                value: Versioned::new(e.kv.mod_revision, decode(&e.kv.value)?),
                key: e.kv.key,
            },
            EventKind::Delete => TypedEvent::Delete {
                revision: e.revision(),
                key: e.kv.key,
            },
        })
    }
}
