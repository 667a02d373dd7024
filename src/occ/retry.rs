use std::cell::Cell;
use std::time::Duration;

/// How an optimistic operation retries after a conflict.
///
/// Attempts are bounded, and between attempts the caller sleeps for a
/// random duration drawn uniformly from zero to an exponentially growing
/// cap ("full jitter"): contending writers spread out instead of colliding
/// again in lockstep, and nobody loops forever (unlike etcd's STM, which
/// retries without bound and without backoff).
///
/// | | attempts | backoff before retry *n* | worst-case total sleep |
/// | --- | --- | --- | --- |
/// | [`RetryPolicy::default`] (stores) | 10 | uniform(0, min(100 ms, 1 ms × 2ⁿ)) | ≈ 0.4 s |
/// | [`RetryPolicy::in_process`] ([`VersionedCell`](super::VersionedCell)) | 64 | uniform(0, min(1 ms, 1 µs × 2ⁿ)) | ≈ 55 ms |
/// | Kubernetes `retry.DefaultRetry`, for comparison | 5 | 10 ms × (1 + 0.1 × rand) | ≈ 55 ms |
///
/// Kubernetes retries a fixed 10 ms with 10% jitter, five times: fine for a
/// handful of controllers, but under real contention five attempts run out
/// and equal sleeps keep writers colliding. calm starts smaller (1 ms, a
/// store round trip), doubles, and jitters fully, which spreads writers
/// out; ten attempts make exhaustion rare but possible, and it is
/// reported as [`RetryExhausted`], never hidden.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use calm::occ::RetryPolicy;
///
/// let patient = RetryPolicy::default()
///     .with_max_attempts(50)
///     .with_max_backoff(Duration::from_secs(1));
/// assert!(patient.backoff(3) <= Duration::from_millis(8));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; at least 1.
    max_attempts: u32,
    /// The cap of the first backoff.
    initial_backoff: Duration,
    /// No backoff exceeds this.
    max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 10 attempts, backoff capped at 1 ms doubling to 100 ms, full jitter.
    fn default() -> Self {
        Self {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(100),
        }
    }
}

impl RetryPolicy {
    /// The policy for in-process compare-and-set, where a conflict costs
    /// nanoseconds: 64 attempts, backoff from 1 µs doubling to 1 ms.
    pub const fn in_process() -> Self {
        Self {
            max_attempts: 64,
            initial_backoff: Duration::from_micros(1),
            max_backoff: Duration::from_millis(1),
        }
    }

    /// Sets the number of attempts (the first included; at least 1).
    pub const fn with_max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = if n == 0 { 1 } else { n };
        self
    }

    /// Sets the cap of the first backoff.
    pub const fn with_initial_backoff(mut self, d: Duration) -> Self {
        self.initial_backoff = d;
        self
    }

    /// Sets the largest backoff.
    pub const fn with_max_backoff(mut self, d: Duration) -> Self {
        self.max_backoff = d;
        self
    }

    /// Attempts in all.
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// A random backoff before retry number `retry` (0 for the first
    /// retry): uniform in `0 ..= min(max_backoff, initial_backoff × 2^retry)`.
    pub fn backoff(&self, retry: u32) -> Duration {
        let cap = self
            .initial_backoff
            .checked_mul(1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX))
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff);
        let nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(random_below(nanos.saturating_add(1)))
    }

    /// Sleeps (blocking the thread) for [`RetryPolicy::backoff`]`(retry)`.
    pub(crate) fn sleep_blocking(&self, retry: u32) {
        let d = self.backoff(retry);
        if d.is_zero() {
            std::thread::yield_now();
        } else {
            std::thread::sleep(d);
        }
    }

    /// Sleeps for [`RetryPolicy::backoff`]`(retry)` on the Tokio timer, or
    /// blocks the thread when called outside a Tokio runtime.
    pub(crate) async fn sleep(&self, retry: u32) {
        let d = self.backoff(retry);
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::time::sleep(d).await;
        } else {
            std::thread::sleep(d);
        }
    }
}

/// Every attempt of an optimistic update conflicted with another writer.
///
/// Nothing was written by the failed attempts. Retry later, with a more
/// patient [`RetryPolicy`], or reduce contention on the value (split it, or
/// make it a CRDT so writers never conflict).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("gave up after {attempts} attempts: every one conflicted with another writer")]
#[non_exhaustive]
pub struct RetryExhausted {
    /// How many attempts were made.
    pub attempts: u32,
}

impl RetryExhausted {
    /// Reports that `attempts` attempts all conflicted (for your own
    /// retry loops).
    pub const fn new(attempts: u32) -> Self {
        Self { attempts }
    }
}

thread_local! {
    /// Per-thread xorshift state for jitter; seeded from the standard
    /// library's random hash keys so threads and processes differ.
    static JITTER: Cell<u64> = Cell::new({
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x9e37_79b9_7f4a_7c15);
        h.finish() | 1
    });
}

/// A random number in `0..n` (`n > 0`), from a per-thread xorshift64*.
/// Jitter needs spread, not cryptographic quality.
pub(crate) fn random_below(n: u64) -> u64 {
    JITTER.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Backoffs stay under their exponential cap and under the maximum.
    #[test]
    fn backoff_is_capped() {
        let p = RetryPolicy::default();
        for retry in 0..40 {
            let cap = Duration::from_millis(1u64 << retry.min(20)).min(Duration::from_millis(100));
            for _ in 0..50 {
                assert!(p.backoff(retry) <= cap);
            }
        }
    }

    /// Jitter actually spreads: backoffs are not all equal.
    #[test]
    fn backoff_is_jittered() {
        let p = RetryPolicy::default();
        let samples: std::collections::BTreeSet<_> = (0..100).map(|_| p.backoff(5)).collect();
        assert!(samples.len() > 50, "{} distinct", samples.len());
    }

    /// Zero attempts is raised to one.
    #[test]
    fn at_least_one_attempt() {
        assert_eq!(
            RetryPolicy::default().with_max_attempts(0).max_attempts(),
            1
        );
    }
}
