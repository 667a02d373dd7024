use std::time::Duration;

use super::RedisLockError;

/// The largest TTL these locks ask Redis for (a day, as for calm's
/// leases). Redis itself takes `PX` up to about 2⁶³ ms, but a lock that
/// lives for more than a day no longer gives anyone liveness.
pub const MAX_TTL: Duration = crate::store::MAX_LEASE_TTL;

/// The longest key (1024 bytes, as for calm's stores). Redis takes keys up
/// to 512 MB, but every request carries the key and every Lua call
/// compares it; a lock name longer than this is a bug.
pub const MAX_KEY_LEN: usize = crate::store::MAX_KEY_LEN;

/// Settings of a [`RedisLock`](super::RedisLock) or
/// [`Redlock`](super::Redlock).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use calm::backend::redis::RedisLockOptions;
///
/// let options = RedisLockOptions::new(Duration::from_secs(5))
///     .with_wait(Duration::from_secs(1))
///     .with_backoff(Duration::from_millis(2), Duration::from_millis(100));
/// assert_eq!(options.ttl, Duration::from_secs(5));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
#[must_use = "options do nothing until passed to RedisLock::new or Redlock::new"]
pub struct RedisLockOptions {
    /// The time to live of the key (`PX`), and so of the lock when its
    /// holder stops extending it.
    pub ttl: Duration,
    /// How long [`acquire`](super::RedisLock::acquire) keeps trying before
    /// it returns [`RedisLockError::TimedOut`] (default 10 s).
    pub wait: Duration,
    /// The shortest pause between two attempts of `acquire` (default
    /// 5 ms). The pause doubles per failed attempt up to `backoff_max`,
    /// and is drawn at random between half of it and all of it, so that
    /// waiters released by the same event do not come back together.
    pub backoff_min: Duration,
    /// The longest pause between two attempts (default 200 ms).
    pub backoff_max: Duration,
    /// How long one request to one Redis may take (default 250 ms). Redlock
    /// asks for this to be small against the TTL, so that a dead instance
    /// does not eat the validity time.
    pub request_timeout: Duration,
    /// The clock-drift allowance, as a fraction of the TTL (default 0.01);
    /// 2 ms are added to it, as the Redlock description does. A holder
    /// counts its lock valid only for `ttl - elapsed - drift`, since its
    /// clock and Redis' may not tick at the same rate.
    pub drift_factor: f64,
    /// Extend after this fraction of the TTL (default 1/3: two extensions
    /// can fail before the lock is in danger).
    pub renew_fraction: f64,
    /// Whether the guard extends the lock in the background (default
    /// `true`). Without it, the guard is lost when its validity ends unless
    /// [`extend`](super::EfficiencyGuard::extend) is called in time.
    pub auto_extend: bool,
}

impl RedisLockOptions {
    /// A TTL, with the defaults above.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            wait: Duration::from_secs(10),
            backoff_min: Duration::from_millis(5),
            backoff_max: Duration::from_millis(200),
            request_timeout: Duration::from_millis(250),
            drift_factor: 0.01,
            renew_fraction: 1.0 / 3.0,
            auto_extend: true,
        }
    }

    /// Sets how long `acquire` keeps trying.
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Sets the bounds of the pause between attempts.
    pub fn with_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = max;
        self
    }

    /// Sets how long one request to one Redis may take.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the clock-drift allowance, as a fraction of the TTL in `[0, 1)`.
    pub fn with_drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// Sets when to extend, as a fraction of the TTL in `(0, 1)`.
    pub fn with_renew_fraction(mut self, fraction: f64) -> Self {
        self.renew_fraction = fraction;
        self
    }

    /// Turns the background extender on or off.
    pub fn with_auto_extend(mut self, on: bool) -> Self {
        self.auto_extend = on;
        self
    }

    /// The clock-drift allowance: `ttl × drift_factor + 2 ms`.
    pub fn drift(&self) -> Duration {
        self.ttl.mul_f64(self.drift_factor) + Duration::from_millis(2)
    }

    /// The TTL in whole milliseconds, for `PX` and `PEXPIRE`.
    pub(super) fn ttl_ms(&self) -> u64 {
        // Checked to be at most MAX_TTL (a day), far below u64::MAX ms.
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// Refuses options out of range, before anything is connected.
    pub(super) fn validate(&self) -> Result<(), RedisLockError> {
        let ttl = |reason| Err(RedisLockError::InvalidTtl { reason });
        let opt = |reason| Err(RedisLockError::InvalidOptions { reason });
        if self.ttl < Duration::from_millis(1) {
            return ttl("a lock needs a time to live of at least one millisecond");
        }
        if self.ttl > MAX_TTL {
            return ttl("time to live above one day (MAX_TTL)");
        }
        if !(self.drift_factor >= 0.0 && self.drift_factor < 1.0) {
            return opt("drift factor must be in [0, 1)");
        }
        if self.drift() >= self.ttl {
            return ttl("time to live not longer than the clock-drift allowance");
        }
        if !(self.renew_fraction > 0.0 && self.renew_fraction < 1.0) {
            return opt("renew fraction must be strictly between 0 and 1");
        }
        if self.backoff_min.is_zero() || self.backoff_min > self.backoff_max {
            return opt("backoff needs 0 < backoff_min <= backoff_max");
        }
        if self.request_timeout.is_zero() {
            return opt("request timeout must be positive");
        }
        Ok(())
    }
}

/// Refuses an empty or oversize key before anything is sent.
pub(super) fn check_key(key: &[u8]) -> Result<(), RedisLockError> {
    if key.is_empty() {
        return Err(RedisLockError::InvalidKey {
            len: 0,
            reason: "keys must not be empty",
        });
    }
    if key.len() > MAX_KEY_LEN {
        return Err(RedisLockError::InvalidKey {
            len: key.len(),
            reason: "keys are at most MAX_KEY_LEN (1024) bytes",
        });
    }
    Ok(())
}
