//! Coordination that stays correct when processes pause: fencing tokens,
//! leases, leader election, locks, idempotency and partition ownership,
//! written once over any [`Store`](crate::store::Store).
//!
//! # The lesson
//!
//! A lock or a lease can revoke permission, but it cannot stop a process
//! that already has it from acting. A holder that is paused (garbage
//! collection, a descheduled VM, a slow network) past its lease's end
//! wakes up believing it still holds the lock, and writes.
//!
//! ```text
//! A: acquire (token 33) ....... paused ........................ write(33) -> REFUSED
//! store:            lease of A expires |
//! B:                                   acquire (token 34)  write(34) -> ok
//! ```
//!
//! A lease gives *liveness* (someone else can take over). *Safety* comes
//! from a token that grows with every grant and a resource that refuses
//! any token lower than the highest it has seen: a [`Fence`] in process,
//! a [`StoreFence`] for data in a store. Every recipe here hands out such
//! a token, taken from the store's revision:
//!
//! - [`Lease`]: a session kept alive in the background, with a loud
//!   [`lost`](Lease::lost) signal;
//! - [`Election`] and [`Lock`]: a line of keys ordered by create revision;
//!   each waiter watches only its predecessor; leaders verify before they
//!   act; [`LeaderLoop`] runs the leader's work while a term lasts and
//!   campaigns again when it ends;
//! - [`Idempotent`]: run once per key, return the recorded outcome to
//!   repeats, take over crashed runs with a higher token;
//! - [`Ownership`]: one owner per key among live members (rendezvous
//!   hashing); a view's token fences owners acting on stale views.
//!
//! # Examples
//!
//! The seed scenario, on the embedded store with a manual clock:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use calm::coord::{CoordError, Lease, LeaseOptions, Lock, StoreFence};
//! use calm::store::{ManualClock, MemoryStore, MemoryStoreOptions};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), CoordError> {
//! let clock = ManualClock::new();
//! let store = MemoryStore::with_options(MemoryStoreOptions::default().with_clock(clock.clone()));
//! let lock = Lock::new(store.clone(), "locks/ledger/")?;
//! let ledger = StoreFence::new(store.clone(), b"ledger/fence".to_vec())?;
//! let opts = LeaseOptions::new(Duration::from_secs(10)).with_clock(Arc::new(clock.clone()));
//!
//! let lease_a = Lease::grant_with(store.clone(), opts.clone()).await?;
//! let a = lock.lock(&lease_a).await?;
//!
//! // A pauses. Nothing it runs (not even its lease keeper) gets to act
//! // while the store's clock passes the lease's TTL.
//! clock.advance(Duration::from_secs(11));
//!
//! let lease_b = Lease::grant_with(store.clone(), opts).await?;
//! let b = lock.lock(&lease_b).await?; // A's key expired with its lease
//! assert!(b.token() > a.token());
//! ledger.put(b.token(), b"ledger/balance", b"B was here").await?;
//!
//! // A wakes and writes with its old token: refused by the resource.
//! let late = ledger.put(a.token(), b"ledger/balance", b"A overwrites").await;
//! assert!(matches!(late, Err(CoordError::Fenced(_))));
//! lease_a.lost().await; // and A's own lease tells it, once it runs again
//! # Ok(())
//! # }
//! ```

mod election;
mod error;
mod fence;
mod idempotent;
mod leader;
mod lease;
mod lock;
mod ownership;
mod queue;

pub use election::{Election, LeaderInfo, Leadership, Observer};
pub use error::{CoordError, Fenced};
pub use fence::{Fence, FencingToken, StoreFence};
pub use idempotent::{Completed, Idempotent};
pub use leader::{Exit, LeaderLoop, Role};
pub use lease::{Lease, LeaseLoss, LeaseOptions, LeaseState, MAX_TTL};
pub use lock::{Lock, LockGuard};
pub use ownership::{Member, Ownership, View, rendezvous_score};
