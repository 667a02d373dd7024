//! Replicated sets, from the simplest to the most useful.
//!
//! | type | insert | remove | re-insert after remove | cost of a removal |
//! | --- | --- | --- | --- | --- |
//! | [`GSet`] | yes | no | n/a | n/a |
//! | [`TwoPhaseSet`] | yes | yes | never (remove is final) | the element, kept forever |
//! | [`OrSet`] | yes | yes | yes | nothing beyond a compact causal context |
//!
//! [`OrSet`] is the one to reach for: *add wins* (an insert concurrent with
//! a remove of the same element survives), an element can come and go any
//! number of times, and removed elements leave no tombstones.
//!
//! # Examples
//!
//! Two replicas edit a shopping list without coordination:
//!
//! ```
//! use calm::causal::ReplicaId;
//! use calm::{Merge, OrSet};
//!
//! let (alice, bob) = (ReplicaId::new(1), ReplicaId::new(2));
//! let mut list = OrSet::new();
//! list.insert(alice, "milk");
//! list.insert(alice, "eggs");
//!
//! let mut bobs = list.clone();
//! bobs.remove(&"milk");       // Bob bought the milk...
//! list.insert(alice, "milk"); // ...while Alice added it again.
//! list.insert(alice, "bread");
//!
//! list.merge(&bobs);
//! bobs.merge(&list);
//! assert_eq!(list, bobs);
//! // Alice's concurrent re-insert wins over Bob's remove.
//! assert_eq!(list.iter().copied().collect::<Vec<_>>(), ["bread", "eggs", "milk"]);
//! ```

mod grow_only;
mod observed_remove;
mod two_phase;

pub use grow_only::GSet;
pub use observed_remove::OrSet;
pub use two_phase::TwoPhaseSet;
