use std::time::Instant;

use super::nodes::{Nodes, backoff, holder_value};
use super::options::check_key;
use super::{EfficiencyGuard, RedisLockError, RedisLockOptions};

/// An efficiency lock on one Redis: `SET key value NX PX ttl` with a
/// random value per holder; extend and release only while the key still
/// holds that value (a Lua script each, atomic on the server).
///
/// The guard it hands out is an [`EfficiencyGuard`]: no fencing token, and
/// not accepted by any of calm's fences. Read its docs before using this
/// for anything but avoiding duplicate work. If that one Redis dies or
/// restarts without persistence, every lock on it is gone at once; see
/// [`Redlock`] for several instances.
///
/// Cloning is cheap and shares the connection.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use calm::backend::redis::{RedisLock, RedisLockOptions};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), calm::backend::redis::RedisLockError> {
/// let options = RedisLockOptions::new(Duration::from_secs(10)).with_wait(Duration::from_secs(2));
/// let locks = RedisLock::new("redis://127.0.0.1:6379/", options)?;
/// let guard = locks.acquire(b"cache/refresh").await?; // waits up to 2 s
/// assert!(locks.try_acquire(b"cache/refresh").await?.is_none());
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RedisLock {
    nodes: Nodes,
}

impl RedisLock {
    /// A lock service on the Redis at `url` (`redis://host:port/db`). The
    /// connection is made on first use and remade after failures.
    ///
    /// # Errors
    ///
    /// [`RedisLockError::InvalidTtl`] or
    /// [`RedisLockError::InvalidOptions`] for options out of range,
    /// [`RedisLockError::InvalidUrl`], or [`RedisLockError::NoRuntime`]
    /// outside a Tokio runtime.
    pub fn new(url: &str, options: RedisLockOptions) -> Result<Self, RedisLockError> {
        Ok(Self {
            nodes: Nodes::connect([url], options)?,
        })
    }

    /// The options in force.
    pub fn options(&self) -> &RedisLockOptions {
        &self.nodes.options
    }

    /// Takes the lock on `key` if nobody holds it: one `SET NX PX`.
    /// Returns `None` if someone does.
    ///
    /// # Errors
    ///
    /// [`RedisLockError::InvalidKey`] (nothing sent), or a request error
    /// ([`RedisLockError::Redis`], [`RedisLockError::RequestTimeout`]).
    ///
    /// # Cancel safety
    ///
    /// If dropped after the request was sent, the key may have been set
    /// with a value nobody holds; it expires after the TTL, and the lock
    /// is unavailable until then.
    pub async fn try_acquire(
        &self,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<EfficiencyGuard>, RedisLockError> {
        try_acquire(&self.nodes, key.as_ref(), None).await
    }

    /// Takes the lock on `key`, waiting for it for up to
    /// [`wait`](RedisLockOptions::wait) with jittered exponential backoff
    /// between attempts (waiters do not come back as a herd).
    ///
    /// # Errors
    ///
    /// [`RedisLockError::TimedOut`] when the wait ends (with the last
    /// attempt's error as its source, if it failed), or
    /// [`RedisLockError::InvalidKey`]. A paused or unreachable Redis never
    /// makes it hang past the wait.
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire(&self, key: impl AsRef<[u8]>) -> Result<EfficiencyGuard, RedisLockError> {
        acquire(&self.nodes, key.as_ref()).await
    }
}

/// An efficiency lock across N independent Redis instances, as the
/// Redlock algorithm describes it.
///
/// To acquire: note the time, `SET key value NX PX ttl` on every instance
/// (each request bounded by [`request_timeout`]), and count. The lock is
/// held if a majority (`n / 2 + 1`) said yes **and** time is left of its
/// validity, `ttl - elapsed - drift` (`drift` is the clock-drift
/// allowance, [`RedisLockOptions::drift`]). Otherwise it is released on
/// **all** instances, including those that did not answer (their answer
/// may be lost, not their write). Extensions need a majority too;
/// release runs on all.
///
/// This buys availability (one of three, two of five instances may be
/// down) and nothing for safety: it assumes bounded pauses, bounded
/// network delay and clocks that tick at about the same rate, and a paused
/// holder still acts after its validity ends. The guard is an
/// [`EfficiencyGuard`], with no fencing token, for that reason. Instances
/// must be independent (not replicas: a replica promoted after a failover
/// may not have the key), and an instance that restarts without
/// persistence should stay down for a TTL before it rejoins.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use calm::backend::redis::{Redlock, RedisLockOptions};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), calm::backend::redis::RedisLockError> {
/// let urls = ["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"];
/// let locks = Redlock::new(urls, RedisLockOptions::new(Duration::from_secs(10)))?;
/// assert_eq!(locks.quorum(), 2);
/// if let Some(guard) = locks.try_acquire(b"jobs/reindex").await? {
///     assert!(guard.valid_for() > Duration::from_secs(9));
///     guard.release().await?;
/// }
/// # Ok(())
/// # }
/// ```
///
/// [`request_timeout`]: RedisLockOptions::request_timeout
#[derive(Debug, Clone)]
pub struct Redlock {
    nodes: Nodes,
}

impl Redlock {
    /// A lock service across the Redis instances at `urls`. Connections
    /// are made on first use: an instance that is down now counts as a
    /// failed answer until it comes back.
    ///
    /// # Errors
    ///
    /// As [`RedisLock::new`], and [`RedisLockError::InvalidOptions`] for
    /// no URL at all.
    pub fn new<I, U>(urls: I, options: RedisLockOptions) -> Result<Self, RedisLockError>
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        Ok(Self {
            nodes: Nodes::connect(urls, options)?,
        })
    }

    /// How many instances must agree: `n / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.nodes.quorum()
    }

    /// How many instances there are.
    pub fn instances(&self) -> usize {
        self.nodes.len()
    }

    /// The options in force.
    pub fn options(&self) -> &RedisLockOptions {
        &self.nodes.options
    }

    /// One round of the algorithm on `key`. Returns `None` if no majority
    /// said yes in time while enough instances answered (someone else
    /// holds it); every partial grant was released.
    ///
    /// # Errors
    ///
    /// [`RedisLockError::InvalidKey`] (nothing sent), or
    /// [`RedisLockError::NoQuorum`] when fewer than a majority answered.
    ///
    /// # Cancel safety
    ///
    /// If dropped mid-round, keys may be left set on some instances with
    /// a value nobody holds; they expire after the TTL.
    pub async fn try_acquire(
        &self,
        key: impl AsRef<[u8]>,
    ) -> Result<Option<EfficiencyGuard>, RedisLockError> {
        try_acquire(&self.nodes, key.as_ref(), None).await
    }

    /// Rounds of [`try_acquire`](Self::try_acquire) with jittered
    /// backoff between them, for up to [`wait`](RedisLockOptions::wait).
    ///
    /// # Errors
    ///
    /// As [`RedisLock::acquire`].
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire(&self, key: impl AsRef<[u8]>) -> Result<EfficiencyGuard, RedisLockError> {
        acquire(&self.nodes, key.as_ref()).await
    }
}

/// One attempt: set on all, keep it on a majority within the validity,
/// else release on all.
async fn try_acquire(
    nodes: &Nodes,
    key: &[u8],
    until: Option<Instant>,
) -> Result<Option<EfficiencyGuard>, RedisLockError> {
    check_key(key)?;
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| RedisLockError::NoRuntime)?;
    let value = holder_value();
    let sent = Instant::now();
    let tally = nodes.set_nx(key, &value, until).await;
    let o = &nodes.options;
    if tally.yes >= nodes.quorum() && sent.elapsed() + o.drift() < o.ttl {
        return Ok(Some(EfficiencyGuard::start(
            nodes.clone(),
            key.to_vec(),
            value,
            sent,
            &runtime,
        )));
    }
    // Not ours: undo what was set, on every instance, including those that
    // failed (a SET whose answer was lost may have been applied). A plain
    // "no" everywhere set nothing. Grants we know of are undone before
    // returning, so the next round (ours or another client's) finds them
    // gone; writes that are only possible (no answer) are undone in the
    // background, so that a frozen Redis cannot stretch `acquire` past its
    // deadline.
    if tally.yes > 0 {
        let _ = nodes.release(key, &value).await;
    } else if tally.failures > 0 {
        let (nodes, key) = (nodes.clone(), key.to_vec());
        runtime.spawn(async move {
            let _ = nodes.release(&key, &value).await;
        });
    }
    match nodes.short(tally) {
        RedisLockError::NotHeld => Ok(None),
        e => Err(e),
    }
}

/// Attempts with jittered exponential backoff until the wait ends.
async fn acquire(nodes: &Nodes, key: &[u8]) -> Result<EfficiencyGuard, RedisLockError> {
    check_key(key)?;
    let start = Instant::now();
    let deadline = start + nodes.options.wait;
    let mut last: Option<RedisLockError>;
    let mut attempt = 0u32;
    loop {
        match try_acquire(nodes, key, Some(deadline)).await {
            Ok(Some(guard)) => return Ok(guard),
            Ok(None) => last = None,
            Err(e) if e.is_retryable() => last = Some(e),
            Err(e) => return Err(e),
        }
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let pause = backoff(&nodes.options, attempt).min(deadline - now);
        attempt = attempt.saturating_add(1);
        tokio::time::sleep(pause).await;
        if Instant::now() >= deadline {
            break;
        }
    }
    Err(RedisLockError::TimedOut {
        waited: start.elapsed(),
        source: last.map(Box::new),
    })
}
