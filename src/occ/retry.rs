use std::cell::Cell;
use std::time::{Duration, Instant};

/// How an optimistic operation retries after a conflict.
///
/// Retries are bounded twice, by a number of attempts and by a total time
/// budget, and between attempts the caller waits for a random duration
/// drawn uniformly from zero to an exponentially growing cap ("full
/// jitter"): contending writers spread out instead of colliding again in
/// lockstep, and nobody loops forever (unlike etcd's STM, which retries
/// without bound and without backoff).
///
/// | | attempts | time budget | backoff before retry *n* |
/// | --- | --- | --- | --- |
/// | [`RetryPolicy::default`] (stores) | 1,000 | 10 s | uniform(0, min(100 ms, 1 ms × 2ⁿ)) |
/// | [`RetryPolicy::in_process`] ([`VersionedCell`](super::VersionedCell)) | 64 | none | spin or yield, up to 1 ms |
/// | Kubernetes `retry.DefaultRetry`, for comparison | 5 | ≈ 55 ms | 10 ms × (1 + 0.1 × rand) |
///
/// Kubernetes retries a fixed 10 ms with 10% jitter, five times: fine for a
/// handful of controllers, but under real contention five attempts run out
/// and equal sleeps keep writers colliding. calm starts smaller (1 ms, a
/// store round trip), doubles, and jitters fully, which spreads writers
/// out; the store default keeps trying for up to ten seconds, so sixteen
/// writers contending on one key all get through (each conflict means
/// another writer succeeded). Running out is reported as
/// [`RetryExhausted`], with the attempts and the time spent, never hidden.
///
/// Waiting never blocks an async executor: in async code it is a Tokio
/// timer (and outside a Tokio runtime, a yield to the caller's executor);
/// an in-process retry ([`VersionedCell::update`](super::VersionedCell::update),
/// which is not async) spins for short backoffs and yields the thread for
/// longer ones, and never sleeps.
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
#[must_use = "a retry policy does nothing until a loop uses it"]
pub struct RetryPolicy {
    /// Attempts in all, the first included; at least 1.
    max_attempts: u32,
    /// The cap of the first backoff.
    initial_backoff: Duration,
    /// No backoff exceeds this.
    max_backoff: Duration,
    /// No retry starts once this much time has passed since the first
    /// attempt (or would pass during its backoff); `None`: no limit.
    budget: Option<Duration>,
}

impl Default for RetryPolicy {
    /// 1,000 attempts within 10 s, backoff capped at 1 ms doubling to
    /// 100 ms, full jitter.
    fn default() -> Self {
        Self {
            max_attempts: 1_000,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(100),
            budget: Some(Duration::from_secs(10)),
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
            budget: None,
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

    /// Sets the total time budget: no retry starts once `d` has passed
    /// since the first attempt, or would pass while backing off.
    pub const fn with_budget(mut self, d: Duration) -> Self {
        self.budget = Some(d);
        self
    }

    /// Removes the time budget (attempts alone bound the retries).
    pub const fn without_budget(mut self) -> Self {
        self.budget = None;
        self
    }

    /// Attempts in all.
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The total time budget, if any.
    pub const fn budget(&self) -> Option<Duration> {
        self.budget
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

    /// Waits without sleeping for [`RetryPolicy::backoff`]`(retry)`: spins
    /// for short backoffs, yields the thread for longer ones. For
    /// synchronous retry loops that may run on an async executor's thread.
    pub(crate) fn pause(&self, retry: u32) {
        /// Spinning past this costs more than giving the core away.
        const SPIN: Duration = Duration::from_micros(20);
        let d = self.backoff(retry);
        if d <= SPIN {
            let until = Instant::now() + d;
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        } else {
            std::thread::yield_now();
        }
    }

    /// Starts one retry loop: the first attempt is being made.
    ///
    /// # Examples
    ///
    /// ```
    /// use calm::occ::RetryPolicy;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let policy = RetryPolicy::default().with_max_attempts(3);
    /// let mut attempts = policy.start();
    /// let mut tries = 1;
    /// // A loop whose every attempt conflicts gives up after three.
    /// let exhausted = loop {
    ///     match attempts.retry().await {
    ///         Ok(()) => tries += 1,
    ///         Err(e) => break e,
    ///     }
    /// };
    /// assert_eq!((tries, exhausted.attempts), (3, 3));
    /// # }
    /// ```
    pub fn start(&self) -> Attempts<'_> {
        Attempts {
            policy: self,
            started: Instant::now(),
            made: 1,
        }
    }
}

/// The attempts of one retry loop under a [`RetryPolicy`]: the first is
/// made when it starts; [`retry`](Attempts::retry) backs off before the
/// next one, or says the policy is spent. For your own optimistic loops
/// (see [`RetryPolicy::start`]).
#[derive(Debug)]
pub struct Attempts<'a> {
    policy: &'a RetryPolicy,
    started: Instant,
    /// Attempts made so far (the current one included).
    made: u32,
}

impl Attempts<'_> {
    /// Attempts made so far.
    pub fn made(&self) -> u32 {
        self.made
    }

    /// Backs off (a Tokio timer; outside a Tokio runtime, one yield to the
    /// executor), then allows another attempt; or, when attempts or the
    /// time budget are spent, returns the error to report.
    ///
    /// # Errors
    ///
    /// [`RetryExhausted`] with the attempts made and the time spent.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped while backing off, no attempt is counted.
    pub async fn retry(&mut self) -> Result<(), RetryExhausted> {
        let d = self.next_backoff()?;
        crate::trace::debug!(attempt = self.made, backoff = ?d, "conflict; retrying");
        if tokio::runtime::Handle::try_current().is_ok() {
            tokio::time::sleep(d).await;
        } else {
            YieldOnce(false).await;
        }
        self.made += 1;
        Ok(())
    }

    /// As [`retry`](Attempts::retry), for synchronous loops: spins for a
    /// short backoff and yields the thread for a longer one, never
    /// sleeping, so it is harmless on an async executor's thread.
    ///
    /// # Errors
    ///
    /// [`RetryExhausted`] with the attempts made and the time spent.
    pub fn retry_now(&mut self) -> Result<(), RetryExhausted> {
        self.next_backoff()?;
        self.policy.pause(self.made - 1);
        self.made += 1;
        Ok(())
    }

    /// The backoff before the next attempt, if one is allowed.
    fn next_backoff(&self) -> Result<Duration, RetryExhausted> {
        let exhausted = RetryExhausted {
            attempts: self.made,
            elapsed: self.started.elapsed(),
        };
        let d = self.policy.backoff(self.made - 1);
        let spent = self.made >= self.policy.max_attempts
            || self
                .policy
                .budget
                .is_some_and(|b| exhausted.elapsed + d > b);
        if spent {
            crate::trace::warn!(
                attempts = exhausted.attempts,
                elapsed = ?exhausted.elapsed,
                "retries exhausted"
            );
            return Err(exhausted);
        }
        Ok(d)
    }
}

/// A future that returns `Pending` once (waking itself), then `Ready`: a
/// yield to whatever executor polls it.
struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            std::task::Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    }
}

/// Every attempt of an optimistic update conflicted with another writer.
///
/// Nothing was written by the failed attempts. Retry later, with a more
/// patient [`RetryPolicy`], or reduce contention on the value (split it, or
/// make it a CRDT so writers never conflict).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "gave up after {attempts} attempts in {elapsed:?}: every one conflicted with another writer"
)]
#[non_exhaustive]
pub struct RetryExhausted {
    /// How many attempts were made.
    pub attempts: u32,
    /// How long they took, backoffs included.
    pub elapsed: Duration,
}

impl RetryExhausted {
    /// Reports that `attempts` attempts all conflicted over `elapsed` (for
    /// your own retry loops).
    pub const fn new(attempts: u32, elapsed: Duration) -> Self {
        Self { attempts, elapsed }
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

/// Seeds this thread's jitter, so a simulation run on it replays
/// ([`testing::sim`](crate::testing::sim)).
#[cfg(feature = "testing")]
pub(crate) fn seed_jitter(seed: u64) {
    JITTER.with(|s| s.set(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1));
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
    use std::future::Future;

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

    /// The time budget stops retries before the attempts run out, and the
    /// error reports both.
    #[tokio::test]
    async fn budget_bounds_retries() {
        let p = RetryPolicy::default()
            .with_initial_backoff(Duration::from_millis(5))
            .with_max_backoff(Duration::from_millis(5))
            .with_budget(Duration::from_millis(60));
        let mut attempts = p.start();
        let started = Instant::now();
        let err = loop {
            if let Err(e) = attempts.retry().await {
                break e;
            }
        };
        assert!(
            started.elapsed() <= Duration::from_millis(200),
            "{:?}",
            started.elapsed()
        );
        assert!(
            err.attempts > 1 && err.attempts < p.max_attempts(),
            "{err:?}"
        );
        // The last backoff ends within the budget, give or take the
        // timer's granularity.
        assert!(err.elapsed <= Duration::from_millis(80), "{err:?}");
    }

    /// Outside a Tokio runtime a retry yields instead of sleeping the
    /// thread, and synchronous retries never sleep either.
    #[test]
    fn no_sleep_outside_tokio() {
        let p = RetryPolicy::default().with_initial_backoff(Duration::from_secs(5));
        let started = Instant::now();
        let mut attempts = p.start();
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut fut = std::pin::pin!(attempts.retry());
        let mut polls = 0;
        while fut.as_mut().poll(&mut cx).is_pending() {
            polls += 1;
        }
        assert_eq!(polls, 1);
        let mut sync = p.start();
        for _ in 0..10 {
            sync.retry_now().unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
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
