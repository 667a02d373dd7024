//! Automerge documents behind calm's [`Merge`], with change-based deltas.
//!
//! [`Document`] wraps an [`automerge::AutoCommit`]. It merges (automerge's
//! own merge, which applies the changes the other side has and this side
//! lacks), encodes with automerge's compressed save format inside calm's
//! header, and can be kept in any [`Store`](crate::store::Store) with
//! [`StoreExt::merge_into`](crate::store::StoreExt::merge_into): several
//! writers edit one document at once with no lock and no lost edit.
//!
//! Two documents are equal when they have the same *heads* (the same set of
//! changes), which is what convergence means for automerge.
//!
//! # Deltas
//!
//! Automerge names history by change hashes, not by version vectors, so
//! [`Document`] does not implement [`DeltaMerge`](crate::DeltaMerge);
//! it ships deltas the automerge way: the receiver sends its
//! [`heads`](Document::heads), the sender answers with
//! [`changes_since`](Document::changes_since) (only the changes the
//! receiver lacks), and the receiver [`apply_changes`](Document::apply_changes).
//!
//! # Examples
//!
//! ```
//! use automerge::{ReadDoc, ROOT, transaction::Transactable};
//! use calm::adapt::automerge::Document;
//! use calm::Merge;
//!
//! let mut a = Document::new();
//! a.edit(|d| d.put(ROOT, "title", "draft")).unwrap();
//! let mut b = a.clone();
//! b.edit(|d| d.put(ROOT, "author", "ada")).unwrap();
//!
//! // a asks b for what it lacks: only b's one change comes back.
//! let delta = b.changes_since(&a.heads());
//! a.apply_changes(&delta).unwrap();
//! assert_eq!(a, b);
//!
//! let mut c = Document::new();
//! c.merge(&a);
//! assert!(c.doc().get(ROOT, "author").unwrap().is_some());
//! ```

use std::fmt;

use automerge::{AutoCommit, AutomergeError, Change, ChangeHash};

use crate::codec::{Codec, DecodeError, Decoder, Encoder, Tagged};
use crate::merge::Merge;

/// An automerge document with calm's [`Merge`] and codec.
///
/// # Untrusted input
///
/// Decoding a document ([`codec::from_bytes`](crate::codec::from_bytes))
/// and [`apply_changes`](Self::apply_changes) give a [`DecodeError`] on
/// corrupt bytes, including bytes on which automerge 0.12 itself panics:
/// the adapter catches that unwind (so it relies on `panic = "unwind"`, the
/// default).
///
/// What calm cannot bound is memory: automerge's loader sizes some of its
/// allocations from lengths written in the input (`cargo fuzz` found a
/// 119-byte document that makes it allocate 2 GiB at once). Unlike calm's
/// own decoders, which never allocate more than the input justifies,
/// decode automerge documents only from peers you trust, or in a process
/// whose memory is bounded.
#[derive(Clone)]
pub struct Document {
    /// The document; every edit is committed before the adapter returns,
    /// so it never holds a pending transaction.
    doc: AutoCommit,
    /// The sorted heads of `doc`, kept in step with it (reading heads needs
    /// `&mut AutoCommit`, while equality gets `&self`).
    heads: Vec<ChangeHash>,
}

impl Document {
    /// An empty document with a random actor id.
    pub fn new() -> Self {
        Self::from(AutoCommit::new())
    }

    /// The document, read only (edit through [`edit`](Self::edit)).
    pub fn doc(&self) -> &AutoCommit {
        &self.doc
    }

    /// Edits the document and commits the edit.
    pub fn edit<R>(&mut self, f: impl FnOnce(&mut AutoCommit) -> R) -> R {
        let r = f(&mut self.doc);
        self.refresh();
        r
    }

    /// The document's heads, sorted: a summary of every change it holds.
    pub fn heads(&self) -> Vec<ChangeHash> {
        self.heads.clone()
    }

    /// The changes a peer whose heads are `have` lacks, encoded.
    pub fn changes_since(&self, have: &[ChangeHash]) -> Vec<u8> {
        let mut doc = self.doc.clone();
        let changes = doc.get_changes(have);
        let mut out = Encoder::new();
        out.length(changes.len());
        for c in changes {
            out.bytes(c.raw_bytes());
        }
        out.into_bytes()
    }

    /// Applies changes from [`changes_since`](Self::changes_since).
    /// Changes whose dependencies are missing wait inside automerge until
    /// those arrive.
    ///
    /// # Errors
    ///
    /// [`DecodeError`] if the bytes are not encoded changes; the document
    /// is unchanged then.
    pub fn apply_changes(&mut self, bytes: &[u8]) -> Result<(), DecodeError> {
        let mut dec = Decoder::new(bytes);
        let n = dec.length()?;
        let mut changes = Vec::with_capacity(n);
        for _ in 0..n {
            let offset = dec.offset();
            let raw = dec.bytes()?;
            changes.push(
                untrusted(|| Change::try_from(raw)).ok_or(DecodeError::Invalid {
                    offset,
                    what: "not an automerge change",
                })?,
            );
        }
        dec.finish()?;
        // On a copy, so a refusal (or a panic inside automerge) leaves the
        // document as it was.
        let mut next = self.doc.clone();
        untrusted(|| next.apply_changes(changes)).ok_or(DecodeError::Invalid {
            offset: 0,
            what: "automerge refused the changes",
        })?;
        self.doc = next;
        self.refresh();
        Ok(())
    }

    /// Re-reads the heads after a change.
    fn refresh(&mut self) {
        self.doc.commit();
        let mut heads = self.doc.get_heads();
        heads.sort();
        self.heads = heads;
    }

    /// Merges `other` in, reporting automerge's error instead of ignoring
    /// it.
    ///
    /// # Errors
    ///
    /// automerge's error if `other` holds changes it cannot apply (only
    /// possible for documents loaded without verification); `self` is
    /// unchanged then.
    pub fn try_merge(&mut self, other: &Self) -> Result<(), AutomergeError> {
        let mut theirs = other.doc.clone();
        let mut next = self.doc.clone();
        next.merge(&mut theirs)?;
        self.doc = next;
        self.refresh();
        Ok(())
    }
}

impl From<AutoCommit> for Document {
    fn from(doc: AutoCommit) -> Self {
        let mut d = Self {
            doc,
            heads: Vec::new(),
        };
        d.refresh();
        d
    }
}

impl Default for Document {
    fn default() -> Self {
        Self::new()
    }
}

impl PartialEq for Document {
    /// Same heads: the same set of changes, hence the same state.
    fn eq(&self, other: &Self) -> bool {
        self.heads == other.heads
    }
}

impl Eq for Document {}

impl fmt::Debug for Document {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Document")
            .field("heads", &self.heads)
            .finish_non_exhaustive()
    }
}

impl Merge for Document {
    /// automerge's merge. Two documents made by automerge always merge; a
    /// failure (a document loaded without verification holding corrupt
    /// changes) leaves `self` unchanged, see [`Document::try_merge`].
    fn merge(&mut self, other: &Self) {
        let _ = self.try_merge(other);
    }
}

impl Codec for Document {
    /// automerge's compressed save format, length-prefixed.
    fn encode(&self, enc: &mut Encoder) {
        let mut doc = self.doc.clone();
        enc.bytes(&doc.save());
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let offset = dec.offset();
        let bytes = dec.bytes()?;
        // automerge loads no bytes as an empty document, but saves one as
        // a chunk header: accepting them would make two encodings of it.
        if bytes.is_empty() {
            return Err(DecodeError::Invalid {
                offset,
                what: "an empty automerge save",
            });
        }
        untrusted(|| AutoCommit::load(bytes))
            .map(Self::from)
            .ok_or(DecodeError::Invalid {
                offset,
                what: "not an automerge document",
            })
    }
}

/// Runs one of automerge's parsers on untrusted bytes: `None` if it
/// returns an error *or panics*.
///
/// automerge 0.12 panics on some corrupt documents instead of returning an
/// error (an `unwrap` in its column decoder, `hexane`; found by `cargo
/// fuzz`). The unwind is caught here, so such bytes give a [`DecodeError`]
/// like any other corrupt input, and whatever automerge was building is
/// dropped. This needs unwinding: in a build with `panic = "abort"` such
/// input still aborts the process.
fn untrusted<T, E>(parse: impl FnOnce() -> Result<T, E>) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(parse))
        .ok()?
        .ok()
}

impl Tagged for Document {
    const TAG: u8 = crate::codec::tags::AUTOMERGE;
}

#[cfg(feature = "testing")]
pub use random_ops::DocOp;

#[cfg(feature = "testing")]
mod random_ops {
    use automerge::transaction::Transactable;
    use automerge::{ActorId, ROOT, ReadDoc, ScalarValue};
    use proptest::prelude::*;

    use super::Document;
    use crate::causal::ReplicaId;
    use crate::testing::RandomOps;

    /// A random edit of a document's root map.
    #[derive(Clone, Debug)]
    pub enum DocOp {
        /// Set a key to a number.
        Put(u8, i64),
        /// Add to a counter under a key (created if absent).
        Increment(u8, i64),
        /// Delete a key.
        Delete(u8),
    }

    impl RandomOps for Document {
        type Op = DocOp;
        fn op_strategy() -> BoxedStrategy<DocOp> {
            prop_oneof![
                3 => (0..5u8, any::<i64>()).prop_map(|(k, v)| DocOp::Put(k, v)),
                2 => (5..8u8, -10..10i64).prop_map(|(k, v)| DocOp::Increment(k, v)),
                1 => (0..8u8).prop_map(DocOp::Delete),
            ]
            .boxed()
        }
        fn apply(&mut self, replica: ReplicaId, op: &DocOp) {
            self.edit(|d| {
                d.set_actor(ActorId::from(replica.get().to_be_bytes().to_vec()));
                let key = |k: &u8| format!("k{k}");
                // Edits of a well-formed document do not fail.
                let _ = match op {
                    DocOp::Put(k, v) => d.put(ROOT, key(k), *v),
                    DocOp::Increment(k, by) => match d.get(ROOT, key(k)) {
                        Ok(Some((automerge::Value::Scalar(s), _)))
                            if matches!(s.as_ref(), ScalarValue::Counter(_)) =>
                        {
                            d.increment(ROOT, key(k), *by)
                        }
                        _ => d.put(ROOT, key(k), ScalarValue::counter(*by)),
                    },
                    DocOp::Delete(k) => d.delete(ROOT, key(k)),
                };
            });
        }
    }
}
