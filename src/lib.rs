//! # calm: replace your locks
//!
//! A distributed lock can revoke permission, but it cannot stop a paused
//! process from acting. A garbage-collection pause, a descheduled VM or a
//! slow network lets a holder whose lease expired write anyway. Leases fix
//! liveness, not safety. calm gives the tools that stay correct anyway:
//!
//! 1. **State that merges** ([`Merge`]): counters, sets, registers and maps
//!    that replicas update independently and merge in any order. No lock, no
//!    leader, no coordination. The name is the CALM theorem: what is
//!    monotonic needs no coordination.
//! 2. **Versions that compare**: read a version, do the work, write only if
//!    it is unchanged (optimistic concurrency).
//! 3. **Tokens that fence**: every grant carries a strictly increasing
//!    token, and the *resource* rejects any token lower than the highest it
//!    has seen, so a paused holder that wakes late is refused, not trusted.
//!
//! ## Which tool do I need?
//!
//! | situation | tool |
//! | --- | --- |
//! | state that can merge (counts, sets, flags, documents) | a CRDT: no coordination at all |
//! | read-modify-write, conflicts rare | compare-and-set on a version, retried |
//! | running twice is harmless if recorded | idempotency keys |
//! | each key can have one owner | partition ownership, owner epochs as tokens |
//! | each entity's writes can go through one place | a single writer per partition |
//! | a lock only to avoid duplicate work (efficiency) | a lease alone is enough |
//! | a lock for correctness (corruption, double spend) | a lock or election on a consensus store **and** a fence at the resource |
//!
//! ## Two replicas that diverge and converge
//!
//! ```
//! use calm::causal::ReplicaId;
//! use calm::{codec, DeltaMerge, Merge, OrSet};
//!
//! let (a, b) = (ReplicaId::new(1), ReplicaId::new(2));
//! let mut at_a = OrSet::new();
//! at_a.insert(a, "apples".to_string());
//! let mut at_b = at_a.clone();
//!
//! // Offline, each replica changes the set.
//! at_a.insert(a, "bread".to_string());
//! at_b.remove(&"apples".to_string());
//! at_b.insert(b, "cheese".to_string());
//!
//! // b asks a for what it lacks; a answers with a small delta, as bytes.
//! let delta = at_a.delta(&at_b.version_vector());
//! let wire = codec::to_bytes(&delta);
//! at_b.merge(&codec::from_bytes(&wire)?);
//! at_a.merge(&at_b);
//!
//! assert_eq!(at_a, at_b);
//! assert_eq!(at_a.iter().collect::<Vec<_>>(), ["bread", "cheese"]);
//! # Ok::<(), calm::Error>(())
//! ```
//!
//! ## The types
//!
//! - [`causal`]: [`ReplicaId`](causal::ReplicaId), [`Dot`](causal::Dot),
//!   [`VersionVector`](causal::VersionVector),
//!   [`CausalContext`](causal::CausalContext).
//! - [`GCounter`], [`PnCounter`]; [`GSet`], [`TwoPhaseSet`], [`OrSet`];
//!   [`LwwRegister`], [`MvRegister`]; [`OrMap`].
//! - [`text`]: [`Text`], collaborative plain text that never interleaves
//!   concurrent typing, with UTF-8 and UTF-16 position conversions.
//! - [`codec`]: the compact, checked binary encoding of every state.
//! - [`sync`]: [`Peer`](sync::Peer), delta sync with another replica
//!   (what it has, what to send it next) over any delivery.
//! - [`occ`]: [`Version`](occ::Version), [`Versioned`](occ::Versioned),
//!   [`VersionedCell`](occ::VersionedCell) (lock-free reads,
//!   compare-and-set), [`RetryPolicy`](occ::RetryPolicy).
//! - [`store`]: the [`Store`](store::Store) model (etcd's: revisions,
//!   compare-and-set, transactions, leases, watches),
//!   [`MemoryStore`](store::MemoryStore), and
//!   [`merge_into`](store::StoreExt::merge_into) for any [`Merge`] value.
//! - [`coord`]: [`Fence`](coord::Fence), [`Lease`](coord::Lease),
//!   [`Election`](coord::Election), [`Lock`](coord::Lock),
//!   [`Idempotent`](coord::Idempotent), [`Ownership`](coord::Ownership),
//!   written once over any store.
//! - [`partition`]: [`SerialExecutor`](partition::SerialExecutor), a
//!   single writer per key in process: each key's work runs in submission
//!   order, one piece at a time, different keys in parallel, no lock.
//! - `backend` (features `postgres`, `etcd`): the store model on
//!   PostgreSQL and etcd.
//! - `adapt` (features `crdts`, `automerge`): [`Merge`] for the `crdts`
//!   crate's types and automerge documents.
//! - `testing` (feature `testing`): the law harness that checks any
//!   [`Merge`] type, yours included; the store conformance suite; fault
//!   injection; real test servers.
//!
//! ## Feature flags
//!
//! - `testing`: the public harnesses (pulls in `proptest`).
//! - `postgres`: the PostgreSQL backend (`tokio-postgres`, `deadpool-postgres`)
//!   and `PgFence`, the fence inside your own PostgreSQL transactions.
//! - `sqlx`: `PgFence::admit_sqlx`, the same fence in a sqlx transaction.
//! - `etcd`: the etcd backend (`tonic`; building it needs no `protoc`).
//! - `crdts`: adapters for the `crdts` crate.
//! - `automerge`: adapters for automerge documents.
//! - `derive`: `#[derive(Merge, DeltaMerge, Codec)]` for a struct whose
//!   fields are states (the `calm-derive` crate).
//! - `tracing`: log events (lease renewals failing, suspended and lost,
//!   with their causes; retries backing off and giving up; watches
//!   reconnecting) through the `tracing` crate.
#![deny(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]
#![deny(unsafe_code)]
#![warn(unreachable_pub)]

#[cfg(any(feature = "crdts", feature = "automerge"))]
pub mod adapt;
#[cfg(any(feature = "postgres", feature = "etcd"))]
pub mod backend;
pub mod causal;
pub mod codec;
pub mod coord;
pub mod counter;
mod error;
pub mod map;
mod merge;
pub mod occ;
pub mod partition;
pub mod register;
pub mod set;
pub mod store;
pub mod sync;
#[cfg(feature = "testing")]
pub mod testing;
pub mod text;
mod trace;

/// `#[derive(Merge)]`, `#[derive(DeltaMerge)]` (feature `derive`): see
/// [`calm_derive`'s docs](https://docs.rs/calm-derive).
#[cfg(feature = "derive")]
pub use calm_derive::{DeltaMerge, Merge};
pub use counter::{CounterOverflow, GCounter, PnCounter};
pub use error::Error;
pub use map::OrMap;
pub use merge::{DeltaMerge, Merge};
pub use register::{LamportStamp, LwwRegister, MvRegister};
pub use set::{GSet, OrSet, TwoPhaseSet};
pub use text::{Text, TextError, TextOp};
