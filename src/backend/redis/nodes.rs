//! The Redis instances a lock lives on, and the three operations on them:
//! `SET NX PX`, extend-if-ours and delete-if-ours, each counted against a
//! majority (one instance: a majority of one).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{RedisLockError, RedisLockOptions};

/// Extends the key's TTL only if it still holds our value. A script, so
/// that the compare and the `PEXPIRE` are one atomic step on the server:
/// a `GET` then `PEXPIRE` from the client could extend a successor's lock.
///
/// Sent with `EVAL`, not `EVALSHA`: a restarted Redis has an empty script
/// cache, and `EVALSHA`'s fallback (load, then call again) needs a second
/// round trip that a request abandoned at its timeout never makes, so a
/// release queued at a frozen server would be lost. The scripts are small.
const EXTEND: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
                        return redis.call('pexpire', KEYS[1], ARGV[2]) \
                      else return 0 end";

/// Deletes the key only if it still holds our value (atomic, as above: a
/// plain `DEL` after the lock expired would delete a successor's lock).
const RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then \
                         return redis.call('del', KEYS[1]) \
                       else return 0 end";

/// One instance's answer to a conditional request.
#[derive(Debug)]
pub(super) enum Answer {
    /// Set, extended or deleted: the key is (was) ours.
    Yes,
    /// The key is someone else's, or nobody's.
    No,
    /// No answer.
    Failed(RedisLockError),
}

/// What a round of requests to every instance came to.
#[derive(Debug)]
pub(super) struct Tally {
    pub(super) yes: usize,
    pub(super) no: usize,
    /// The last failure, if any.
    pub(super) failed: Option<RedisLockError>,
    pub(super) failures: usize,
}

/// The instances of one lock service, with the majority they need.
///
/// Each instance is reached through the `redis` crate's connection
/// manager, created lazily: an instance that is down when the lock is
/// created is simply one that fails its requests until it comes back.
#[derive(Clone)]
pub(super) struct Nodes {
    /// One reconnecting connection per instance.
    conns: Arc<[ConnectionManager]>,
    /// `conns.len() / 2 + 1`.
    quorum: usize,
    pub(super) options: RedisLockOptions,
}

impl std::fmt::Debug for Nodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nodes")
            .field("instances", &self.conns.len())
            .field("quorum", &self.quorum)
            .finish()
    }
}

impl Nodes {
    pub(super) fn connect<I, U>(urls: I, options: RedisLockOptions) -> Result<Self, RedisLockError>
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        options.validate()?;
        // The connection manager spawns a task at creation.
        tokio::runtime::Handle::try_current().map_err(|_| RedisLockError::NoRuntime)?;
        // Reconnection is bounded by the request timeout: a request waits
        // at most that long for a connection; after a failed reconnection
        // the next request starts another. Two quick retries cover a
        // connection reset; longer outages are the caller's to retry.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.request_timeout))
            .set_response_timeout(Some(options.request_timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        let conns = urls
            .into_iter()
            .map(|url| {
                let url = url.as_ref();
                let bad = |e: redis::RedisError| RedisLockError::InvalidUrl {
                    url: url.to_owned(),
                    source: Box::new(e),
                };
                let client = redis::Client::open(url).map_err(bad)?;
                ConnectionManager::new_lazy_with_config(client, config.clone()).map_err(bad)
            })
            .collect::<Result<Arc<[_]>, _>>()?;
        if conns.is_empty() {
            return Err(RedisLockError::InvalidOptions {
                reason: "a lock needs at least one redis instance",
            });
        }
        let quorum = conns.len() / 2 + 1;
        Ok(Self {
            conns,
            quorum,
            options,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.conns.len()
    }

    pub(super) fn quorum(&self) -> usize {
        self.quorum
    }

    /// Runs `request` on every instance at once (one instance: inline,
    /// with no task), each bounded by the request timeout and by `until`.
    async fn on_all<F, Fut>(&self, until: Option<Instant>, request: F) -> Tally
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: Future<Output = Result<bool, redis::RedisError>> + Send + 'static,
    {
        let limit = match until {
            Some(t) => self
                .options
                .request_timeout
                .min(t.saturating_duration_since(Instant::now())),
            None => self.options.request_timeout,
        };
        let bounded = |fut: Fut| async move {
            match tokio::time::timeout(limit, fut).await {
                Ok(Ok(true)) => Answer::Yes,
                Ok(Ok(false)) => Answer::No,
                // The client's own response timeout (set to the same
                // limit) may fire first: the same failure.
                Ok(Err(e)) if e.is_timeout() => {
                    Answer::Failed(RedisLockError::RequestTimeout { after: limit })
                }
                Ok(Err(e)) => Answer::Failed(RedisLockError::redis(e)),
                Err(_) => Answer::Failed(RedisLockError::RequestTimeout { after: limit }),
            }
        };
        let mut tally = Tally {
            yes: 0,
            no: 0,
            failed: None,
            failures: 0,
        };
        let mut count = |answer| match answer {
            Answer::Yes => tally.yes += 1,
            Answer::No => tally.no += 1,
            Answer::Failed(e) => {
                tally.failures += 1;
                tally.failed = Some(e);
            }
        };
        if let [conn] = &self.conns[..] {
            count(bounded(request(conn.clone())).await);
        } else {
            // Redlock's description asks the instances one after another;
            // asking them together spends the validity time once instead
            // of n times, and the validity is still measured from before
            // the first request went out. Dropping this future aborts the
            // tasks (the JoinSet's drop).
            let mut set = tokio::task::JoinSet::new();
            for conn in self.conns.iter() {
                set.spawn(bounded(request(conn.clone())));
            }
            while let Some(joined) = set.join_next().await {
                count(joined.unwrap_or_else(|_| {
                    Answer::Failed(RedisLockError::RequestTimeout { after: limit })
                }));
            }
        }
        tally
    }

    /// `SET key value NX PX ttl` on every instance.
    pub(super) async fn set_nx(&self, key: &[u8], value: &[u8], until: Option<Instant>) -> Tally {
        let ttl = self.options.ttl_ms();
        let (key, value) = (Arc::<[u8]>::from(key), Arc::<[u8]>::from(value));
        self.on_all(until, move |mut conn| {
            let (key, value) = (Arc::clone(&key), Arc::clone(&value));
            async move {
                let set: redis::Value = redis::cmd("SET")
                    .arg(&*key)
                    .arg(&*value)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl)
                    .query_async(&mut conn)
                    .await?;
                Ok(!matches!(set, redis::Value::Nil))
            }
        })
        .await
    }

    /// Runs `script` (EXTEND or RELEASE) with the key and our value on
    /// every instance.
    async fn if_ours(&self, script: &'static str, key: &[u8], value: &[u8]) -> Tally {
        let ttl = self.options.ttl_ms();
        let (key, value) = (Arc::<[u8]>::from(key), Arc::<[u8]>::from(value));
        self.on_all(None, move |mut conn| {
            let (key, value) = (Arc::clone(&key), Arc::clone(&value));
            async move {
                let done: i64 = redis::cmd("EVAL")
                    .arg(script)
                    .arg(1)
                    .arg(&*key)
                    .arg(&*value)
                    .arg(ttl)
                    .query_async(&mut conn)
                    .await?;
                Ok(done == 1)
            }
        })
        .await
    }

    /// Extends the key's TTL where it still holds `value`.
    pub(super) async fn extend(&self, key: &[u8], value: &[u8]) -> Tally {
        self.if_ours(EXTEND, key, value).await
    }

    /// Deletes the key where it still holds `value`.
    pub(super) async fn release(&self, key: &[u8], value: &[u8]) -> Tally {
        self.if_ours(RELEASE, key, value).await
    }

    /// What a round that did not reach a majority of yeses means: the lock
    /// is someone else's (`NotHeld`) when enough instances said no, else
    /// too few answered (`NoQuorum`; with one instance, its own error).
    pub(super) fn short(&self, tally: Tally) -> RedisLockError {
        if tally.yes + tally.no >= self.quorum || tally.failed.is_none() {
            RedisLockError::NotHeld
        } else if self.conns.len() == 1 {
            tally.failed.unwrap_or(RedisLockError::NotHeld)
        } else {
            RedisLockError::NoQuorum {
                answered: tally.yes + tally.no,
                needed: self.quorum,
                source: tally.failed.map(Box::new),
            }
        }
    }
}

/// A fresh random value for one holder: 16 bytes from the OS, as 32 hex
/// digits, so no two holders (in any process) share one.
pub(super) fn holder_value() -> Vec<u8> {
    let mut raw = [0u8; 16];
    // The OS random source does not fail on the platforms calm supports;
    // if it did, the clock and pid still make the value unique enough for
    // an efficiency lock (a collision lets two holders release each
    // other's lock, never more).
    if getrandom::fill(&mut raw).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        raw = (nanos ^ (u128::from(std::process::id()) << 96)).to_be_bytes();
    }
    raw.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
        .into_bytes()
}

/// The pause before attempt `attempt + 1` (0-based): exponential from
/// `min`, capped at `max`, drawn in `[half, all]` of that.
pub(super) fn backoff(options: &RedisLockOptions, attempt: u32) -> Duration {
    let full = options
        .backoff_min
        .saturating_mul(1u32 << attempt.min(20))
        .min(options.backoff_max);
    let half = full / 2;
    let jitter = getrandom::u64().unwrap_or(0) % (half.as_micros() as u64 + 1);
    half + Duration::from_micros(jitter)
}
