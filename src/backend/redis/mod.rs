//! Efficiency locks on Redis (feature `redis`): the casual lock, typed so
//! that it can never pass for a correctness lock.
//!
//! # Two kinds of lock
//!
//! If a lock only keeps two workers from doing the same job at once, and a
//! job done twice is merely wasteful (a cache refreshed twice, a report
//! built twice, an idempotent batch run twice), a Redis key set with
//! `SET key value NX PX ttl` is enough, and many teams already run Redis.
//! If two holders at once would corrupt data or spend money twice, no
//! lock is enough: take a [`Lock`](crate::coord::Lock) on a consensus
//! store and pass its [`FencingToken`](crate::coord::FencingToken) to a
//! fence at the resource ([`coord`](crate::coord) explains why).
//!
//! This module is the first kind, and its types say so: the guard is an
//! [`EfficiencyGuard`], it carries no fencing token, and nothing in calm
//! that guards a resource accepts it. The reason is the pause:
//!
//! ```text
//! A: acquire (value a) .. check: held .. paused ..................... write -> accepted!
//! redis:                                    key of A expires |
//! B:                                                          acquire (value b)  write
//! ```
//!
//! A checked, then paused (GC, a descheduled VM) past the TTL; B acquired;
//! A woke and wrote, still believing it held the lock. Both acted. A random
//! value cannot be compared against the next holder's, so a resource has
//! nothing to refuse A with. `tests/redis.rs` runs exactly this with a
//! holder process frozen by SIGSTOP, and then the same story with
//! [`Lock`](crate::coord::Lock) and a [`StoreFence`](crate::coord::StoreFence),
//! where A's late write is refused.
//!
//! # The types
//!
//! - [`RedisLock`]: one Redis. [`try_acquire`](RedisLock::try_acquire) is
//!   one `SET NX PX` with a random 128-bit value per holder;
//!   [`acquire`](RedisLock::acquire) retries with jittered exponential
//!   backoff until a deadline, and returns
//!   [`RedisLockError::TimedOut`] rather than hang on a paused server.
//! - [`Redlock`]: N independent instances, as the Redlock algorithm
//!   describes (a majority within the validity time, a clock-drift
//!   allowance, release on all), for availability when one Redis dies.
//! - [`EfficiencyGuard`]: extends itself in the background and says
//!   loudly when the lock is lost ([`lost`](EfficiencyGuard::lost), as
//!   [`Lease::lost`](crate::coord::Lease::lost)); extend and release run a
//!   Lua script that acts only if the key still holds our value.
//!
//! # What is tested, and what is not
//!
//! Against real `redis-server` processes the tests start: acquire,
//! extend and release; a non-holder's extend and release refused with the
//! key untouched; bad keys and TTLs refused before anything is sent;
//! Redis killed and restarted under a holder (the lost signal fires, and
//! acquisition resumes); Redis frozen (acquire times out with a typed
//! error); Redlock on three and five servers with one down. A network
//! that delays packets without dropping them is out of reach of those
//! tests (it needs a traffic shaper), so the validity arithmetic under
//! such delays is reasoned, not tested.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use calm::backend::redis::{RedisLock, RedisLockOptions};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), calm::backend::redis::RedisLockError> {
//! let locks = RedisLock::new("redis://127.0.0.1/", RedisLockOptions::new(Duration::from_secs(10)))?;
//! let guard = locks.acquire(b"cache/refresh/users").await?;
//! // ... refresh the cache; tolerate that, rarely, another worker does too.
//! tokio::select! {
//!     () = async { /* the work */ } => {}
//!     loss = guard.lost() => eprintln!("lock lost ({loss}); stopping early"),
//! }
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```

mod error;
mod guard;
mod lock;
mod nodes;
mod options;

pub use error::RedisLockError;
pub use guard::{EfficiencyGuard, EfficiencyLoss, EfficiencyState};
pub use lock::{RedisLock, Redlock};
pub use options::{MAX_KEY_LEN, MAX_TTL, RedisLockOptions};
