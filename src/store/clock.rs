//! Time as the store sees it, injectable so tests can jump it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// A boxed future that sleeps.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A monotonic clock: the time that judges lease expiry.
///
/// [`SystemClock`] is the real one. [`ManualClock`] only moves when a test
/// moves it, so a test can expire a lease, or pause a "process", exactly
/// when it wants.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Time since this clock's epoch. Never goes backwards.
    fn now(&self) -> Duration;

    /// A future that completes once [`now`](Clock::now) reaches `deadline`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it only stops the wait.
    fn sleep_until(&self, deadline: Duration) -> Sleep;
}

/// The real monotonic clock (`std::time::Instant`).
///
/// Sleeping uses the Tokio timer, so [`Clock::sleep_until`] must be polled
/// inside a Tokio runtime with time enabled.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    /// The instant this clock reads as zero.
    epoch: Instant,
}

impl SystemClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn sleep_until(&self, deadline: Duration) -> Sleep {
        let at = tokio::time::Instant::from_std(self.epoch + deadline);
        Box::pin(tokio::time::sleep_until(at))
    }
}

/// A clock that moves only when told to.
///
/// Clones share the same time. Sleepers wake as soon as an
/// [`advance`](ManualClock::advance) reaches their deadline, so tests are
/// deterministic and instant.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use calm::store::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// assert_eq!(clock.now(), Duration::ZERO);
/// clock.advance(Duration::from_secs(5));
/// assert_eq!(clock.now(), Duration::from_secs(5));
/// ```
#[derive(Clone, Default)]
pub struct ManualClock {
    /// The shared time and the wake-up for sleepers.
    inner: Arc<ManualInner>,
}

#[derive(Default)]
struct ManualInner {
    /// The current time; only grows.
    now: Mutex<Duration>,
    /// Notified on every advance.
    moved: Notify,
}

impl ManualClock {
    /// A clock at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward by `by`, waking every sleeper whose deadline
    /// passed.
    pub fn advance(&self, by: Duration) {
        {
            let mut now = self
                .inner
                .now
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *now = now.saturating_add(by);
        }
        self.inner.moved.notify_waiters();
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ManualClock").field(&self.now()).finish()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        *self
            .inner
            .now
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn sleep_until(&self, deadline: Duration) -> Sleep {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            loop {
                // Register for the next advance *before* reading the time,
                // so an advance between the read and the await is not lost.
                let moved = inner.moved.notified();
                tokio::pin!(moved);
                moved.as_mut().enable();
                if *inner.now.lock().unwrap_or_else(PoisonError::into_inner) >= deadline {
                    return;
                }
                moved.await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sleeper on the manual clock wakes exactly when time reaches its
    /// deadline, not before.
    #[tokio::test]
    async fn manual_sleep_wakes_on_advance() {
        let clock = ManualClock::new();
        let sleeper = tokio::spawn(clock.sleep_until(Duration::from_secs(10)));
        tokio::task::yield_now().await;
        clock.advance(Duration::from_secs(9));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(Duration::from_secs(1));
        tokio::time::timeout(Duration::from_secs(5), sleeper)
            .await
            .expect("woke")
            .expect("joined");
    }
}
