use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};

use super::{RetryExhausted, RetryPolicy, Version, Versioned};

/// One value shared between threads, updated by compare-and-set on its
/// version instead of under a lock.
///
/// - [`load`](Self::load) never blocks and never waits for a writer: it is
///   a lock-free read of a pointer (built on `arc-swap`, whose loads are
///   wait-free in the common case), returning the value with its version.
/// - [`compare_and_set`](Self::compare_and_set) installs a new value only if
///   the version is still the one you read; otherwise it hands your value
///   back with the current version ([`Conflict`]), so nothing is lost.
/// - [`update`](Self::update) loops read-compute-CAS under a bounded,
///   jittered [`RetryPolicy`].
///
/// Versions start at 1 and grow by one per successful write.
///
/// This type has no `unsafe` and no atomics of its own; its concurrency
/// rests on `arc-swap`, which is tested under loom upstream.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use calm::occ::VersionedCell;
///
/// let hits = Arc::new(VersionedCell::new(0u64));
/// let threads: Vec<_> = (0..4)
///     .map(|_| {
///         let hits = Arc::clone(&hits);
///         std::thread::spawn(move || {
///             for _ in 0..100 {
///                 hits.update(|n| n + 1).unwrap();
///             }
///         })
///     })
///     .collect();
/// for t in threads {
///     t.join().unwrap();
/// }
/// let now = hits.load();
/// assert_eq!(*now.value(), 400);
/// assert_eq!(now.version().get(), 401);
/// ```
pub struct VersionedCell<T> {
    /// The current value and version, replaced whole on every write; a
    /// version is never reused because every write makes a new allocation
    /// with `version + 1` and installs it only over the one it read.
    current: ArcSwap<Versioned<T>>,
}

/// A snapshot of a [`VersionedCell`]: the value and version at one instant.
///
/// Holding it does not block writers; it only keeps that value alive. Hold
/// it briefly (arc-swap's fast path has a few slots per thread; long-lived
/// snapshots fall back to a slower reference count).
pub struct Snapshot<T>(Guard<Arc<Versioned<T>>>);

impl<T> Deref for Snapshot<T> {
    type Target = Versioned<T>;
    fn deref(&self) -> &Versioned<T> {
        &self.0
    }
}

impl<T: fmt::Debug> fmt::Debug for Snapshot<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

/// A compare-and-set lost: the version was no longer the expected one.
///
/// Not an error but an expected outcome of optimistic concurrency: re-read
/// (the current version is here), recompute, try again. Your value is
/// handed back so nothing is lost.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("version conflict: the value is now at {current}")]
#[non_exhaustive]
pub struct Conflict<T> {
    /// The version the cell holds now.
    pub current: Version,
    /// The value you tried to write.
    pub value: T,
}

impl<T> VersionedCell<T> {
    /// Creates a cell holding `value` at version 1.
    pub fn new(value: T) -> Self {
        Self {
            current: ArcSwap::from_pointee(Versioned::new(Version::new(1), value)),
        }
    }

    /// The current value and version. Never blocks.
    pub fn load(&self) -> Snapshot<T> {
        Snapshot(self.current.load())
    }

    /// The current value and version as an owned `Arc`, for keeping.
    pub fn load_full(&self) -> Arc<Versioned<T>> {
        self.current.load_full()
    }

    /// Writes `value` if the cell is still at `expected`; returns the new
    /// version.
    ///
    /// # Errors
    ///
    /// [`Conflict`] with the current version and your value if another
    /// write happened since `expected`. The cell is unchanged.
    pub fn compare_and_set(&self, expected: Version, value: T) -> Result<Version, Conflict<T>> {
        self.set_if_current(&self.current.load(), expected, value)
    }

    /// Installs `value` at `expected + 1` if the cell still holds `seen`
    /// (which the caller loaded and expects to be at `expected`).
    fn set_if_current(
        &self,
        seen: &Guard<Arc<Versioned<T>>>,
        expected: Version,
        value: T,
    ) -> Result<Version, Conflict<T>> {
        if seen.version() != expected {
            return Err(Conflict {
                current: seen.version(),
                value,
            });
        }
        let next = Arc::new(Versioned::new(expected.next(), value));
        // Installs `next` only if the pointer is still the one we read. The
        // guard `seen` keeps that allocation alive, so its address cannot
        // be reused by another write in between (no ABA).
        let prev = self.current.compare_and_swap(seen, Arc::clone(&next));
        if Arc::ptr_eq(&prev, seen) {
            return Ok(expected.next());
        }
        let current = prev.version();
        drop(prev);
        // The failed swap dropped its clone of `next`, so ours is the only
        // one left and unwrapping gives the caller's value back.
        match Arc::try_unwrap(next) {
            Ok(v) => Err(Conflict {
                current,
                value: v.into_parts().1,
            }),
            Err(_) => unshared_write(),
        }
    }

    /// Replaces the value with `f(current)`, retrying on conflict under
    /// [`RetryPolicy::in_process`]; returns the new version.
    ///
    /// `f` may run several times (once per attempt), so it must not have
    /// side effects that cannot be repeated.
    ///
    /// # Errors
    ///
    /// [`RetryExhausted`] if every attempt conflicted; nothing was written.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use calm::occ::VersionedCell;
    ///
    /// let hits = Arc::new(VersionedCell::new(0u64));
    /// let workers: Vec<_> = (0..4)
    ///     .map(|_| {
    ///         let hits = Arc::clone(&hits);
    ///         std::thread::spawn(move || {
    ///             for _ in 0..100 {
    ///                 hits.update(|n| n + 1).expect("not every attempt conflicts");
    ///             }
    ///         })
    ///     })
    ///     .collect();
    /// for w in workers {
    ///     w.join().unwrap();
    /// }
    /// assert_eq!(*hits.load().value(), 400); // no lock, no lost update
    /// ```
    pub fn update(&self, f: impl FnMut(&T) -> T) -> Result<Version, RetryExhausted> {
        self.update_with(&RetryPolicy::in_process(), f)
    }

    /// As [`update`](Self::update), with an explicit policy.
    ///
    /// # Errors
    ///
    /// [`RetryExhausted`] if every attempt conflicted; nothing was written.
    pub fn update_with(
        &self,
        policy: &RetryPolicy,
        mut f: impl FnMut(&T) -> T,
    ) -> Result<Version, RetryExhausted> {
        let mut attempts = policy.start();
        loop {
            let seen = self.current.load();
            let next = f(seen.value());
            match self.set_if_current(&seen, seen.version(), next) {
                Ok(v) => return Ok(v),
                Err(_) => attempts.retry_now()?,
            }
        }
    }
}

#[cold]
fn unshared_write() -> ! {
    unreachable!("a value never published cannot be shared")
}

impl<T: Default> Default for VersionedCell<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T: fmt::Debug> fmt::Debug for VersionedCell<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("VersionedCell").field(&*self.load()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stale compare-and-set leaves the cell unchanged and returns the
    /// caller's value.
    #[test]
    fn stale_cas_is_refused_without_change() {
        let c = VersionedCell::new(String::from("a"));
        let v1 = c.load().version();
        let v2 = c.compare_and_set(v1, "b".into()).unwrap();
        let err = c.compare_and_set(v1, "c".into()).unwrap_err();
        assert_eq!(
            err,
            Conflict {
                current: v2,
                value: "c".to_string()
            }
        );
        assert_eq!(c.load().value(), "b");
        assert_eq!(c.load().version(), v2);
    }

    /// Threads hammering `update` lose no increment, and versions count
    /// writes exactly.
    #[test]
    fn concurrent_updates_lose_nothing() {
        let c = Arc::new(VersionedCell::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || {
                    for _ in 0..2_000 {
                        c.update_with(&RetryPolicy::in_process().with_max_attempts(10_000), |n| {
                            n + 1
                        })
                        .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*c.load().value(), 8_000);
        assert_eq!(c.load().version(), Version::new(8_001));
    }

    /// With one attempt and a competing writer, `update` reports
    /// exhaustion instead of writing.
    #[test]
    fn exhaustion_is_reported() {
        let c = VersionedCell::new(0);
        let policy = RetryPolicy::in_process().with_max_attempts(1);
        let err = c
            .update_with(&policy, |n| {
                // A competing write lands between our read and our CAS.
                let seen = c.load().version();
                c.compare_and_set(seen, 100).unwrap();
                n + 1
            })
            .unwrap_err();
        assert_eq!(err.attempts, 1);
        assert_eq!(*c.load().value(), 100);
    }
}
