//! calm's [`Merge`](crate::Merge) for other crates' CRDTs, so they get the
//! law harness, the codec and [`merge_into`](crate::store::StoreExt::merge_into)
//! on every store without being rewritten.
//!
//! - [`crdts`] (feature `crdts`): the `crdts` crate's state types;
//! - [`automerge`] (feature `automerge`): automerge documents, with
//!   change-based deltas.

#[cfg(feature = "automerge")]
pub mod automerge;
#[cfg(feature = "crdts")]
pub mod crdts;
