//! The observed-remove join, written once for every type that tags its
//! contents with dots ([`OrSet`](crate::OrSet), [`MvRegister`](crate::MvRegister),
//! [`OrMap`](crate::OrMap)).
//!
//! Such a state is a set of live dots (each carrying an element or value)
//! plus a [`CausalContext`] of every dot it has seen. A dot that was seen
//! but is no longer live was removed. Joining two states keeps a dot when
//!
//! - both sides hold it live, or
//! - one side holds it and the other has never seen it.
//!
//! A dot that one side holds and the other has seen but dropped stays
//! removed. That is "observed remove": a remove affects exactly the dots its
//! replica had seen, so a concurrent insert (a dot the remover never saw)
//! survives. Because the context is a compact range set, removals cost no
//! per-element tombstone.
//!
//! Delta sync for these types: against a peer's version vector `since`, the
//! delta holds the live dots the peer has not seen, and the context minus
//! the live dots the peer *has* seen. The peer then keeps its copies of the
//! latter (they are not in the delta's context), drops the dots this side
//! removed (they are), and learns the new ones, which gives exactly the full
//! join (`a ⊔ delta(b, vv(a)) == a ⊔ b`) whenever `since ⊆ ctx(a)`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{CausalContext, Dot, VersionVector};
use crate::codec::{self, Codec, DecodeError, Decoder, Encoder};
use crate::merge::Merge;

/// Something tagged with the dot of the update that made it: a bare [`Dot`]
/// (set elements) or a `(Dot, value)` pair (register values, map entries).
pub(crate) trait Dotted: Clone {
    /// The dot of the update that made this entry.
    fn dot(&self) -> Dot;
    /// Merges the other side's copy of the same dot into this one. Values
    /// made by one update are equal on every replica, so for immutable
    /// values this does nothing.
    fn merge_same(&mut self, _other: &Self) {}
}

impl Dotted for Dot {
    fn dot(&self) -> Dot {
        *self
    }
}

impl<V: Clone> Dotted for (Dot, V) {
    fn dot(&self) -> Dot {
        self.0
    }
}

/// Joins one key's entries with the other side's, in place.
///
/// Both lists are sorted by dot and free of repeated dots; so is the result.
pub(crate) fn join_dotted<E: Dotted>(
    ours: &mut Vec<E>,
    theirs: &[E],
    our_ctx: &CausalContext,
    their_ctx: &CausalContext,
) {
    let find = |list: &[E], d: Dot| list.binary_search_by(|e| e.dot().cmp(&d));
    ours.retain_mut(|e| match find(theirs, e.dot()) {
        Ok(i) => {
            e.merge_same(&theirs[i]);
            true
        }
        Err(_) => !their_ctx.contains(e.dot()),
    });
    for e in theirs {
        if !our_ctx.contains(e.dot()) {
            if let Err(i) = find(ours, e.dot()) {
                ours.insert(i, e.clone());
            }
        }
    }
}

/// Checks one key's entries: non-empty, strictly sorted by dot, all in
/// `ctx`. Returns what is wrong.
pub(crate) fn check_dotted<E: Dotted>(
    entries: &[E],
    ctx: &CausalContext,
) -> Result<(), &'static str> {
    if entries.is_empty() {
        return Err("entry without dots");
    }
    if entries.windows(2).any(|w| w[0].dot() >= w[1].dot()) {
        return Err("dots out of order or repeated");
    }
    if entries.iter().any(|e| !ctx.contains(e.dot())) {
        return Err("live dot outside the causal context");
    }
    Ok(())
}

/// The context to ship in a delta against `since`: everything seen, minus
/// the live dots the peer already holds (see the module docs).
pub(crate) fn delta_context(
    ctx: &CausalContext,
    live: impl IntoIterator<Item = Dot>,
    since: &VersionVector,
) -> CausalContext {
    let seen_live = CausalContext::from_dots(live.into_iter().filter(|d| since.contains(*d)));
    ctx.difference(&seen_live)
}

/// Keys, each with the dotted entries that keep it alive, plus the causal
/// context: the state shared by [`OrSet`](crate::OrSet) (entries are bare
/// dots) and [`OrMap`](crate::OrMap) (entries are `(dot, value)` births).
///
/// Invariant: every key's entry list is non-empty, strictly sorted by dot,
/// and every dot in it is in `ctx`. Decoding and deserializing check it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "DotStoreRepr<K, E>", into = "DotStoreRepr<K, E>")]
#[serde(bound(
    deserialize = "K: Ord + Deserialize<'de>, E: Dotted + Deserialize<'de>",
    serialize = "K: Clone + Serialize, E: Clone + Serialize"
))]
pub(crate) struct DotStore<K, E> {
    /// Live keys and their entries.
    pub(crate) entries: BTreeMap<K, Vec<E>>,
    /// Every dot seen, live or removed.
    pub(crate) ctx: CausalContext,
}

/// The serde form of a [`DotStore`], checked on the way in.
#[derive(Serialize, Deserialize)]
#[serde(bound(deserialize = "K: Ord + Deserialize<'de>, E: Deserialize<'de>"))]
struct DotStoreRepr<K, E> {
    entries: BTreeMap<K, Vec<E>>,
    ctx: CausalContext,
}

/// A deserialized state broke the dot invariants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct InvalidDots(&'static str);

impl<K: Ord, E: Dotted> TryFrom<DotStoreRepr<K, E>> for DotStore<K, E> {
    type Error = InvalidDots;
    fn try_from(r: DotStoreRepr<K, E>) -> Result<Self, InvalidDots> {
        for list in r.entries.values() {
            check_dotted(list, &r.ctx).map_err(InvalidDots)?;
        }
        Ok(Self {
            entries: r.entries,
            ctx: r.ctx,
        })
    }
}

impl<K, E> From<DotStore<K, E>> for DotStoreRepr<K, E> {
    fn from(s: DotStore<K, E>) -> Self {
        Self {
            entries: s.entries,
            ctx: s.ctx,
        }
    }
}

impl<K, E> Default for DotStore<K, E> {
    fn default() -> Self {
        Self {
            entries: BTreeMap::new(),
            ctx: CausalContext::new(),
        }
    }
}

impl<K: Ord + Clone, E: Dotted> Merge for DotStore<K, E> {
    fn merge(&mut self, other: &Self) {
        // Keys we hold: join with the other side's entries (maybe none).
        // Then keys only the other side holds.
        let our_ctx = &self.ctx;
        self.entries.retain(|k, ours| {
            let theirs = other.entries.get(k).map_or(&[][..], Vec::as_slice);
            join_dotted(ours, theirs, our_ctx, &other.ctx);
            !ours.is_empty()
        });
        for (k, theirs) in &other.entries {
            if !self.entries.contains_key(k) {
                let mut ours = Vec::new();
                join_dotted(&mut ours, theirs, &self.ctx, &other.ctx);
                if !ours.is_empty() {
                    self.entries.insert(k.clone(), ours);
                }
            }
        }
        self.ctx.merge(&other.ctx);
    }
}

impl<K: Ord + Clone, E: Dotted> DotStore<K, E> {
    /// The delta against `since` (see the module docs).
    pub(crate) fn delta(&self, since: &VersionVector) -> Self {
        let entries = self
            .entries
            .iter()
            .filter_map(|(k, list)| {
                let new: Vec<E> = list
                    .iter()
                    .filter(|e| !since.contains(e.dot()))
                    .cloned()
                    .collect();
                (!new.is_empty()).then(|| (k.clone(), new))
            })
            .collect();
        let live = self.entries.values().flatten().map(Dotted::dot);
        Self {
            entries,
            ctx: delta_context(&self.ctx, live, since),
        }
    }

    /// A fresh dot for `replica`, recorded in the context.
    #[track_caller]
    pub(crate) fn new_dot(&mut self, replica: super::ReplicaId) -> Dot {
        let dot = self.ctx.next_dot(replica);
        self.ctx.insert(dot);
        dot
    }
}

impl<K: Codec + Ord, E: Codec + Dotted> Codec for DotStore<K, E> {
    /// The context, then the keys in order, each with its entries.
    fn encode(&self, enc: &mut Encoder) {
        self.ctx.encode(enc);
        enc.length(self.entries.len());
        for (k, list) in &self.entries {
            k.encode(enc);
            codec::encode_seq(enc, list.len(), list);
        }
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let ctx = CausalContext::decode(dec)?;
        let mut entries = BTreeMap::new();
        codec::decode_sorted_by_key(
            dec,
            |dec| {
                let k = K::decode(dec)?;
                let offset = dec.offset();
                let list = Vec::<E>::decode(dec)?;
                check_dotted(&list, &ctx).map_err(|what| DecodeError::Invalid { offset, what })?;
                Ok((k, list))
            },
            |(k, _)| k,
            |(k, list)| {
                entries.insert(k, list);
            },
        )?;
        Ok(Self { entries, ctx })
    }
}
