use super::queue::{self, Ticket};
use super::{CoordError, FencingToken, Lease};
use crate::occ::RetryPolicy;
use crate::store::Store;

/// A distributed lock whose guard carries a fencing token.
///
/// The same recipe as [`Election`](super::Election): a key per waiter,
/// attached to its [`Lease`], first in line holds the lock, each waiter
/// watches only its predecessor. Holding the lock is a claim that may
/// already be stale when you act (a pause after acquiring is invisible to
/// you), so the guard's [`token`](LockGuard::token) must go with every
/// guarded write and be checked at the resource.
///
/// Use a lock when the work must not run twice *for correctness* only
/// together with a fence; for efficiency alone, a [`Lease`] is enough.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use calm::coord::{Fence, Lease, Lock};
/// use calm::store::MemoryStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), calm::coord::CoordError> {
/// let store = MemoryStore::new();
/// let lock = Lock::new(store.clone(), "locks/report/")?;
/// let fence = Fence::new(); // at the resource
/// let lease = Lease::grant(store.clone(), Duration::from_secs(10)).await?;
/// let guard = lock.lock(&lease).await?;
/// fence.check(guard.token())?; // the resource checks the token
/// guard.unlock().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Lock<S> {
    store: S,
    prefix: Vec<u8>,
    retry: RetryPolicy,
}

impl<S: Store + Clone + 'static> Lock<S> {
    /// A lock whose waiters live under `prefix`.
    ///
    /// # Errors
    ///
    /// [`CoordError::InvalidName`] for an empty or oversized prefix.
    pub fn new(store: S, prefix: impl Into<Vec<u8>>) -> Result<Self, CoordError> {
        let prefix = prefix.into();
        queue::check_prefix(&prefix)?;
        Ok(Self {
            store,
            prefix,
            retry: RetryPolicy::default().with_max_attempts(20),
        })
    }

    /// Waits for the lock as `lease`; returns the guard once held and
    /// verified.
    ///
    /// # Errors
    ///
    /// [`CoordError::LeaseLost`] if the lease ends while waiting, or a
    /// store error that did not clear after retries.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if dropped while waiting, the waiter's key is deleted
    /// in the background, so an abandoned wait never ends up holding the
    /// lock. One wait per lease at a time.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use calm::coord::{Lease, Lock, StoreFence};
    /// use calm::store::MemoryStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::coord::CoordError> {
    /// let store = MemoryStore::new();
    /// let lock = Lock::new(store.clone(), "locks/ledger/")?;
    /// let ledger = StoreFence::new(store.clone(), b"ledger/fence".to_vec())?;
    /// let lease = Lease::grant(store, Duration::from_secs(10)).await?;
    /// let guard = lock.lock(&lease).await?;
    /// // The lock alone is not enough: the write carries its token, and the
    /// // fence refuses it if a later holder has written since.
    /// ledger.put(guard.token(), b"ledger/balance", b"100").await?;
    /// guard.unlock().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn lock(&self, lease: &Lease<S>) -> Result<LockGuard<S>, CoordError> {
        let ticket = queue::take_turn(
            &self.store,
            &self.prefix,
            lease,
            b"",
            None,
            &self.retry,
            true,
        )
        .await?
        .ok_or(CoordError::LeaseLost { lease: lease.id() })?;
        Ok(self.guard(ticket))
    }

    /// Takes the lock if nobody holds it or waits for it; `None` (having
    /// left the line) otherwise.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use calm::coord::{Lease, Lock};
    /// use calm::store::MemoryStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), calm::coord::CoordError> {
    /// let store = MemoryStore::new();
    /// let lock = Lock::new(store.clone(), "locks/job/")?;
    /// let (a, b) = (
    ///     Lease::grant(store.clone(), Duration::from_secs(10)).await?,
    ///     Lease::grant(store.clone(), Duration::from_secs(10)).await?,
    /// );
    /// let held = lock.try_lock(&a).await?.expect("free");
    /// assert!(lock.try_lock(&b).await?.is_none()); // held: b does not wait
    /// held.unlock().await?;
    /// assert!(lock.try_lock(&b).await?.is_some());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_lock(&self, lease: &Lease<S>) -> Result<Option<LockGuard<S>>, CoordError> {
        let ticket = queue::take_turn(
            &self.store,
            &self.prefix,
            lease,
            b"",
            None,
            &self.retry,
            false,
        )
        .await?;
        Ok(ticket.map(|t| self.guard(t)))
    }

    /// Waits for the lock at most `timeout`; `None` if it did not come
    /// (the place in line is given up, leaving no key behind).
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock).
    pub async fn lock_timeout(
        &self,
        lease: &Lease<S>,
        timeout: std::time::Duration,
    ) -> Result<Option<LockGuard<S>>, CoordError> {
        match tokio::time::timeout(timeout, self.lock(lease)).await {
            Ok(guard) => guard.map(Some),
            Err(_) => Ok(None),
        }
    }

    fn guard(&self, ticket: queue::Ticket) -> LockGuard<S> {
        LockGuard {
            store: self.store.clone(),
            ticket,
            released: false,
        }
    }
}

/// A held lock. Pass [`token`](LockGuard::token) to every guarded write.
///
/// Release it with [`unlock`](LockGuard::unlock). Dropping the guard
/// releases it **best effort**: inside a Tokio runtime a background task
/// deletes the key; otherwise (or if that fails) the lock is held until
/// the lease ends.
#[derive(Debug)]
#[must_use = "dropping a guard releases the lock at once (best effort)"]
pub struct LockGuard<S: Store + Clone + 'static> {
    store: S,
    ticket: Ticket,
    /// Whether `unlock` ran.
    released: bool,
}

impl<S: Store + Clone + 'static> LockGuard<S> {
    /// The fencing token of this hold.
    pub fn token(&self) -> FencingToken {
        self.ticket.token()
    }

    /// Checks that the lock is still held (its key exists with its create
    /// revision).
    ///
    /// # Errors
    ///
    /// [`CoordError::NotLeader`] if the hold ended.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn verify(&self) -> Result<(), CoordError> {
        queue::verify(&self.store, &self.ticket).await
    }

    /// Releases the lock, waking the next waiter.
    ///
    /// # Errors
    ///
    /// A store error (the lock is then released when the lease ends).
    ///
    /// # Cancel safety
    ///
    /// If dropped before the delete reaches the store, the drop of the
    /// guard releases it best effort.
    pub async fn unlock(mut self) -> Result<(), CoordError> {
        queue::leave(&self.store, &self.ticket).await?;
        self.released = true;
        Ok(())
    }
}

impl<S: Store + Clone + 'static> Drop for LockGuard<S> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let (store, ticket) = (self.store.clone(), self.ticket.clone());
            handle.spawn(async move {
                let _ = queue::leave(&store, &ticket).await;
            });
        }
    }
}
