//! A single writer per partition: route all writes for an entity through
//! one consumer, and ordering and exclusivity fall out of the routing
//! rather than a lock.
//!
//! # The idea
//!
//! Code that updates shared entities usually guards them with locks: a
//! `Mutex<HashMap<K, V>>`, an entry lock in a concurrent map, or a
//! `tokio::sync::Mutex` per key. Every writer then races for the lock, and
//! the lock's holder may be descheduled, await I/O or panic while everyone
//! else waits behind it.
//!
//! Turn it around. Give each entity (an account, a document, a cart) **one
//! consumer**, and send every write for it there instead of letting
//! writers in. The consumer takes one write at a time, so two writes for
//! one entity never overlap, and it takes them in the order they arrived,
//! so they apply in that order. Nothing was locked: ordering and
//! exclusivity are what routing everything through one place *means*.
//! Writes for different entities go to different consumers and run in
//! parallel.
//!
//! ```text
//!  writers               partitions (one consumer each)
//!  w(alice,+5) ──┐
//!  w(bob,  +7) ──┼──►  alice: [+5, -2]  ── runs +5, then -2
//!  w(alice,-2) ──┘     bob:   [+7]      ── runs +7, alongside alice
//! ```
//!
//! # In process: [`SerialExecutor`]
//!
//! [`SerialExecutor`] is that routing inside one process, on Tokio:
//! [`submit`](SerialExecutor::submit) (async work) and
//! [`submit_fn`](SerialExecutor::submit_fn) (a closure) queue work for a
//! key and hand back a [`Completion`] to await its output. A busy key gets
//! one task that drains its queue; an idle key costs nothing (no task, no
//! map entry). Queues are bounded ([`SerialOptions`]): a full one makes
//! `submit` wait and `try_submit` refuse with [`SerialError::Full`],
//! handing the work back in a [`Rejected`]. A panicking piece of work fails
//! only its own [`Completion`]; [`shutdown`](SerialExecutor::shutdown)
//! runs everything accepted and refuses the rest.
//!
//! # Examples
//!
//! Four tellers deposit into ten accounts at once. Each deposit reads the
//! balance, awaits something, and writes the balance back: on its own, a
//! textbook lost update. Routed through the account's partition, no
//! deposit is lost, and there is no lock anywhere:
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
//! use calm::partition::{SerialError, SerialExecutor, SerialOptions};
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), SerialError> {
//! let balances: Arc<Vec<AtomicI64>> = Arc::new((0..10).map(|_| AtomicI64::new(0)).collect());
//! let writer = SerialExecutor::with_options(SerialOptions::default().with_queue_capacity(64));
//!
//! let mut tellers = Vec::new();
//! for teller in 0..4 {
//!     let (writer, balances) = (writer.clone(), balances.clone());
//!     tellers.push(tokio::spawn(async move {
//!         for i in 0..100 {
//!             let balances = balances.clone();
//!             let account = (teller * 100 + i) % 10;
//!             let deposit = async move {
//!                 let balance = balances[account].load(Relaxed);
//!                 tokio::task::yield_now().await; // I/O, say
//!                 balances[account].store(balance + 1, Relaxed);
//!             };
//!             // The deposit runs whether or not its Completion is awaited.
//!             drop(writer.submit(account, deposit).await?);
//!         }
//!         Ok::<(), SerialError>(())
//!     }));
//! }
//! for teller in tellers {
//!     teller.await.expect("teller panicked")?;
//! }
//! writer.shutdown().await; // every accepted deposit has run
//!
//! assert!(balances.iter().all(|b| b.load(Relaxed) == 40)); // none lost
//! assert_eq!(writer.active_keys(), 0); // and nothing left behind
//! # Ok(())
//! # }
//! ```
//!
//! # Where to read next
//!
//! Within one process the executor is enough. Across processes the same
//! idea needs one owner per partition among live members and a fence
//! against owners that paused: [`Ownership`](crate::coord::Ownership)
//! assigns keys to members and hands out view tokens, and
//! [`StoreFence`](crate::coord::StoreFence) refuses a stale owner's
//! writes.

mod completion;
mod error;
mod serial;

pub use completion::Completion;
pub use error::{Rejected, SerialError};
pub use serial::{SerialExecutor, SerialOptions};
