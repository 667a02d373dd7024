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
//! key and hand back a [`Completion`] to await its output;
//! [`run`](SerialExecutor::run) submits async work and waits for its
//! output in one call, running it in the caller's own task when the key
//! is idle (as a lock per key would, with no task spawned). A busy key
//! gets one task that drains its queue; an idle key costs nothing (no
//! task, no map entry). Queues are bounded ([`SerialOptions`]): a full one makes
//! `submit` wait and `try_submit` refuse with [`SerialError::Full`],
//! handing the work back in a [`Rejected`]. A panicking piece of work fails
//! only its own [`Completion`]; [`shutdown`](SerialExecutor::shutdown)
//! runs everything accepted and refuses the rest.
//!
//! Where a lock is still cheaper: tiny synchronous updates that never
//! await, such as bumping a counter, cost 2–3× a `Mutex<HashMap>` update
//! on one thread in calm's bench, and up to about 3× when many threads
//! hit a few hot keys, whose work queues for a drain task while a mutex's
//! callers just take turns. The executor pays off where work awaits (I/O
//! between the read and the write): there it matches a
//! `tokio::sync::Mutex` per key and leaves no map entry or task behind
//! for idle keys.
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
//! # Across processes: [`PartitionLog`]
//!
//! Across processes the same idea needs one owner per partition among
//! live members, and a fence against owners that paused. A
//! [`PartitionLog`] keeps the commands in a [`Store`](crate::store::Store):
//! producers [`append`](PartitionLog::append) a command for an entity
//! key, the key picks one of a fixed number of partitions, and the
//! store's revision orders them. Members of an
//! [`Ownership`](crate::coord::Ownership) group call
//! [`apply_owned`](PartitionLog::apply_owned) with their current view:
//! each partition is owned by one member of the view, which applies its
//! commands oldest first, each in one transaction that writes the
//! command's effects, records the partition's progress and deletes the
//! command, fenced by the view's token. A member that paused or was cut
//! off wakes with an older view; its first write is refused
//! ([`Applied::fenced`]), and the new owner goes on from the progress
//! recorded. Every command is applied exactly once, each entity's in
//! the order they were appended, with no lock held anywhere.
//!
//! ```text
//!  producers ── append(key, cmd) ──►  store: log/<p>/<id>  (revision order)
//!                                            │
//!  member owning p in view v ── apply_owned ─┘
//!      one txn per command, fenced by v's token:
//!      effects + progress/<p> = revision + delete log/<p>/<id>
//! ```
//!
//! Effects outside the store cannot join that transaction: fence them at
//! the resource with the view's token
//! (`backend::postgres::PgFence` for PostgreSQL
//! tables), or make them idempotent under the command's revision.

mod completion;
mod error;
mod log;
mod serial;

pub use completion::Completion;
pub use error::{LogError, Rejected, SerialError};
pub use log::{Applied, Command, MAX_ENTITY_KEY, MAX_PARTITIONS, PartitionLog};
pub use serial::{SerialExecutor, SerialOptions};
