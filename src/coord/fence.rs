use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::{CoordError, Fenced};
use crate::occ::{RetryExhausted, Version};
use crate::store::{Compare, CompareOp, Store, StoreError, Txn, TxnOp, TxnOpResult, check_key};

/// Attempts of a fenced write against writers racing on the fence key.
const FENCE_ROUNDS: u32 = 16;

/// A strictly increasing number carried by every grant (a lock, a term of
/// leadership, an ownership, a claim), for the resource to check.
///
/// Tokens come from the store's revision (the create revision of the key
/// that represents the grant), so a later grant always has a larger token,
/// whatever the clocks of the processes involved say.
///
/// # Examples
///
/// ```
/// use calm::coord::FencingToken;
///
/// assert!(FencingToken::new(34) > FencingToken::new(33));
/// ```
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a number.
    pub const fn new(t: u64) -> Self {
        Self(t)
    }

    /// The number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The 8-byte big-endian form, whose byte order is the numeric order
    /// (what a store compares).
    pub const fn to_bytes(self) -> [u8; 8] {
        self.0.to_be_bytes()
    }

    /// Reads the 8-byte big-endian form.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(|b| Self(u64::from_be_bytes(b)))
    }
}

impl From<Version> for FencingToken {
    fn from(v: Version) -> Self {
        Self(v.get())
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// The check at the resource: remembers the highest token seen and refuses
/// any lower one.
///
/// An **equal** token is accepted: the holder of a grant writes many times
/// with the same token. A **lower** token means a newer grant exists, so
/// the writer was paused, partitioned or slow and must stop.
///
/// In process this is one atomic (`fetch_max`), safe to share between
/// threads. For a resource kept in a [`Store`], see [`StoreFence`].
///
/// # Examples
///
/// The seed scenario: A gets 33 and pauses; B gets 34 and writes; A wakes
/// and writes with 33, and is refused.
///
/// ```
/// use calm::coord::{Fence, FencingToken};
///
/// let fence = Fence::new();
/// let (a, b) = (FencingToken::new(33), FencingToken::new(34));
/// fence.check(b)?;            // B writes
/// let err = fence.check(a).unwrap_err(); // A wakes up late
/// assert_eq!((err.presented, err.highest), (a, b));
/// # Ok::<(), calm::coord::Fenced>(())
/// ```
#[derive(Debug, Default)]
pub struct Fence {
    /// The highest token admitted so far.
    highest: AtomicU64,
}

impl Fence {
    /// A fence that has seen no token.
    pub const fn new() -> Self {
        Self {
            highest: AtomicU64::new(0),
        }
    }

    /// Admits `token` if it is at least the highest seen (raising it), or
    /// refuses it.
    ///
    /// Call it *before* the guarded effect, under whatever makes the effect
    /// atomic with the check (for an in-memory resource, the same critical
    /// section; for a store, use [`StoreFence`]).
    ///
    /// # Errors
    ///
    /// [`Fenced`] naming both tokens if a higher one was already admitted.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::coord::{Fence, FencingToken};
    ///
    /// let fence = Fence::new();
    /// assert!(fence.check(FencingToken::new(33)).is_ok());
    /// assert!(fence.check(FencingToken::new(34)).is_ok()); // a newer holder
    /// // The paused holder of #33 wakes and tries to write: refused.
    /// let refused = fence.check(FencingToken::new(33)).unwrap_err();
    /// assert_eq!(refused.highest, FencingToken::new(34));
    /// ```
    pub fn check(&self, token: FencingToken) -> Result<(), Fenced> {
        // The common cases need no read-modify-write: the holder presenting
        // the current token again, or a stale token. Acquire pairs with the
        // release half of the fetch_max below that admitted the token.
        let seen = self.highest.load(Ordering::Acquire);
        if token.0 == seen {
            return Ok(());
        }
        if token.0 < seen {
            return Err(Fenced::new(token, FencingToken(seen)));
        }
        // AcqRel: admitting a token happens-after every earlier admission,
        // so a writer that passes sees the effects of the writers before it.
        let prev = self.highest.fetch_max(token.0, Ordering::AcqRel);
        if token.0 >= prev {
            Ok(())
        } else {
            Err(Fenced::new(token, FencingToken(prev)))
        }
    }

    /// The highest token admitted so far.
    pub fn highest(&self) -> FencingToken {
        FencingToken(self.highest.load(Ordering::Acquire))
    }
}

/// A fence for data kept in a [`Store`]: every write is a transaction that
/// compares the token stored under the fence key and writes only if the
/// presented token is at least as high.
///
/// The check and the write are one transaction, so a stale writer can never
/// slip a write in between (the store's atomicity does what a critical
/// section does in process). One fence key can guard any number of data
/// keys.
///
/// # Examples
///
/// ```
/// use calm::coord::{FencingToken, StoreFence};
/// use calm::store::{MemoryStore, Store};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), calm::coord::CoordError> {
/// let store = MemoryStore::new();
/// let fence = StoreFence::new(store.clone(), b"fence/orders".to_vec())?;
/// fence.put(FencingToken::new(34), b"orders/1", b"from B").await?;
/// let late = fence.put(FencingToken::new(33), b"orders/1", b"from A").await;
/// assert!(late.unwrap_err().is_lost_grant());
/// assert_eq!(store.get(b"orders/1").await?.unwrap().value, b"from B");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct StoreFence<S> {
    store: S,
    /// The key holding the highest admitted token (8 bytes big-endian).
    fence_key: Vec<u8>,
}

impl<S: Store> StoreFence<S> {
    /// A fence whose highest token lives under `fence_key`.
    ///
    /// # Errors
    ///
    /// [`CoordError::Store`] with an invalid-key error for an empty or
    /// oversized key.
    pub fn new(store: S, fence_key: Vec<u8>) -> Result<Self, CoordError> {
        check_key(&fence_key)?;
        Ok(Self { store, fence_key })
    }

    /// Runs `ops` atomically if `token` is at least the highest token seen,
    /// raising the fence to `token`; returns the revision of the write.
    ///
    /// # Errors
    ///
    /// [`CoordError::Fenced`] if a higher token was admitted (nothing is
    /// written), [`StoreError::Contention`] if other writers kept changing
    /// the fence key for 16 rounds, or a store error.
    ///
    /// # Cancel safety
    ///
    /// As [`Store::txn`]: all or nothing, but a remote write dropped in
    /// flight may or may not have committed.
    pub async fn write(&self, token: FencingToken, ops: Vec<TxnOp>) -> Result<Version, CoordError> {
        let written = self.write_if(token, Vec::new(), ops).await?;
        // With no compares of the caller's, only the fence can refuse.
        written.ok_or_else(|| {
            CoordError::Store(StoreError::Backend {
                source: "a fenced write without compares was refused by none".into(),
            })
        })
    }

    /// As [`write`](StoreFence::write), when `compares` also hold: runs
    /// `ops` atomically if `token` is at least the highest token seen and
    /// every compare holds, raising the fence to `token`. Returns the
    /// revision of the write, or `None` if the token was admissible but a
    /// compare failed (nothing written).
    ///
    /// # Errors
    ///
    /// As [`write`](StoreFence::write).
    ///
    /// # Cancel safety
    ///
    /// As [`Store::txn`].
    pub async fn write_if(
        &self,
        token: FencingToken,
        compares: Vec<Compare>,
        ops: Vec<TxnOp>,
    ) -> Result<Option<Version>, CoordError> {
        self.write_built(token, || (compares.clone(), ops.clone()))
            .await
    }

    /// As [`write_if`](StoreFence::write_if), with the compares and writes
    /// built for each attempt by `build` (called again only when another
    /// writer changed the fence key in between), so nothing is copied.
    pub(crate) async fn write_built(
        &self,
        token: FencingToken,
        mut build: impl FnMut() -> (Vec<Compare>, Vec<TxnOp>),
    ) -> Result<Option<Version>, CoordError> {
        // stored <= token, as bytes: any 8-byte value is below the token's
        // bytes followed by 0x00 exactly when it is at most the token. An
        // absent fence key fails every value compare, so it is tested apart.
        let token_bytes = token.to_bytes();
        let mut bound = [0u8; 9];
        bound[..8].copy_from_slice(&token_bytes);
        let mut expect_absent = false;
        let mut started = None;
        // Each lost round means another writer changed the fence key in
        // between (created it, or raised it to at most our token): bounded.
        for _ in 0..FENCE_ROUNDS {
            let guard = if expect_absent {
                Compare::absent(&self.fence_key)
            } else {
                Compare::value(&self.fence_key, CompareOp::Less, &bound)
            };
            let (compares, ops) = build();
            let mut txn = Txn {
                compares: Vec::with_capacity(1 + compares.len()),
                success: Vec::with_capacity(1 + ops.len()),
                failure: vec![TxnOp::get(&self.fence_key)],
            };
            txn.compares.push(guard);
            txn.compares.extend(compares);
            txn.success.push(TxnOp::put(&self.fence_key, &token_bytes));
            txn.success.extend(ops);
            let out = self.store.txn(txn).await?;
            if out.succeeded {
                return Ok(Some(out.revision));
            }
            started.get_or_insert_with(std::time::Instant::now);
            match out.results.first() {
                Some(TxnOpResult::Get { kv: Some(kv) }) => {
                    let highest =
                        FencingToken::from_bytes(&kv.value).unwrap_or(FencingToken(u64::MAX));
                    if highest > token {
                        return Err(Fenced::new(token, highest).into());
                    }
                    // The guard held as read: a compare of the caller's
                    // failed.
                    if !expect_absent && kv.value.as_slice() < bound.as_slice() {
                        return Ok(None);
                    }
                    expect_absent = false;
                }
                _ if expect_absent => return Ok(None),
                _ => expect_absent = true,
            }
        }
        let elapsed = started.map_or(std::time::Duration::ZERO, |s| s.elapsed());
        Err(StoreError::Contention(RetryExhausted::new(FENCE_ROUNDS, elapsed)).into())
    }

    /// A fenced single put.
    ///
    /// # Errors
    ///
    /// As [`StoreFence::write`].
    ///
    /// # Cancel safety
    ///
    /// As [`StoreFence::write`].
    pub async fn put(
        &self,
        token: FencingToken,
        key: &[u8],
        value: &[u8],
    ) -> Result<Version, CoordError> {
        self.write(token, vec![TxnOp::put(key, value)]).await
    }

    /// The highest token admitted (zero if none).
    ///
    /// # Errors
    ///
    /// A store error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn highest(&self) -> Result<FencingToken, CoordError> {
        Ok(self
            .store
            .get(&self.fence_key)
            .await?
            .and_then(|kv| FencingToken::from_bytes(&kv.value))
            .unwrap_or_default())
    }
}
