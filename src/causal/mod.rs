//! Who did what: replica identities, dots, version vectors and causal
//! contexts.
//!
//! Every update a replica makes gets a [`Dot`]: the replica's
//! [`ReplicaId`] and a counter that replica increments by one per update.
//! A dot names an event uniquely, as long as no two live replicas share an
//! id (never reuse a `ReplicaId`; give each process, thread or document
//! session its own).
//!
//! Two summaries of "which events have I seen":
//!
//! - a [`VersionVector`] maps each replica to the highest counter seen
//!   *contiguously* from 1. It is what a replica sends to a peer to ask
//!   "what am I missing?" ([`DeltaMerge::delta`](crate::DeltaMerge::delta)).
//! - a [`CausalContext`] is an exact set of dots, stored per replica as
//!   sorted ranges, so a gap (an event seen out of order, or a removal
//!   learned without the events before it) costs one range and contiguous
//!   runs compact to a single `start..=end`. Observed-remove types
//!   ([`OrSet`](crate::OrSet), [`MvRegister`](crate::MvRegister),
//!   [`OrMap`](crate::OrMap)) use it to remember removals without keeping a
//!   tombstone per removed element.
//!
//! # Examples
//!
//! ```
//! use calm::causal::{CausalContext, ReplicaId, VersionVector};
//!
//! let a = ReplicaId::new(1);
//! let mut ctx = CausalContext::new();
//! let d1 = ctx.next_dot(a);
//! ctx.insert(d1);
//! let d2 = ctx.next_dot(a);
//! ctx.insert(d2);
//! assert_eq!(d2.counter(), 2);
//!
//! let vv = ctx.version_vector();
//! assert_eq!(vv.get(a), 2);
//! assert!(vv.contains(d1));
//! assert!(vv > VersionVector::new());
//! ```

mod context;
mod dot;
pub(crate) mod kernel;
mod version_vector;

pub use context::CausalContext;
pub use dot::{Dot, ReplicaId};
pub use version_vector::VersionVector;
