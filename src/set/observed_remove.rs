use serde::{Deserialize, Serialize};

use crate::causal::kernel::DotStore;
use crate::causal::{CausalContext, Dot, ReplicaId, VersionVector};
use crate::codec::{self, Codec, DecodeError, Decoder, Encoder, Tagged};
use crate::merge::{DeltaMerge, Merge};

/// An observed-remove set: add wins, elements come and go freely, and
/// removals leave no tombstones.
///
/// Every insert tags the element with a fresh [`Dot`]. A remove drops the
/// dots it has *observed*; the causal context remembers them as seen, so a
/// merge with a replica that still holds them knows they were removed, while
/// a dot it never saw (a concurrent insert) survives.
///
/// Contract:
///
/// - merge is commutative, associative and idempotent; states may be
///   delivered in any order, duplicated or late;
/// - an insert concurrent with a remove of the same element wins;
/// - two concurrent inserts of one element leave it present once (with two
///   dots, which the next local insert or remove collapses);
/// - each replica must use its own [`ReplicaId`]; sharing one loses inserts;
/// - memory: one entry per present element plus the causal context, which
///   is a few ranges per replica however many elements were removed.
///
/// Delta sync: see [`DeltaMerge`].
///
/// # Examples
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::{Merge, OrSet};
///
/// let (a, b) = (ReplicaId::new(1), ReplicaId::new(2));
/// let mut x = OrSet::new();
/// x.insert(a, "k");
/// let mut y = x.clone();
/// y.remove(&"k");     // y removes the k it saw...
/// x.insert(a, "k");   // ...while x re-inserts it concurrently
/// y.merge(&x);
/// assert!(y.contains(&"k")); // add wins
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
#[serde(bound(
    deserialize = "T: Ord + Deserialize<'de>",
    serialize = "T: Clone + Serialize"
))]
pub struct OrSet<T> {
    /// Present elements, each with the live dots of its inserts.
    store: DotStore<T, Dot>,
}

impl<T> Default for OrSet<T> {
    fn default() -> Self {
        Self {
            store: DotStore::default(),
        }
    }
}

impl<T: Ord> OrSet<T> {
    /// Creates an empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Removes `value` (every insert of it this replica has seen); returns
    /// whether it was present.
    pub fn remove(&mut self, value: &T) -> bool {
        self.store.entries.remove(value).is_some()
    }

    /// Removes every element.
    pub fn clear(&mut self) {
        self.store.entries.clear();
    }

    /// Whether `value` is present.
    pub fn contains(&self, value: &T) -> bool {
        self.store.entries.contains_key(value)
    }

    /// The present elements in order.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.store.entries.keys()
    }

    /// The number of present elements.
    pub fn len(&self) -> usize {
        self.store.entries.len()
    }

    /// Whether no element is present.
    pub fn is_empty(&self) -> bool {
        self.store.entries.is_empty()
    }

    /// Every dot this set has seen.
    pub fn context(&self) -> &CausalContext {
        &self.store.ctx
    }
}

impl<T: Ord + Clone> OrSet<T> {
    /// Inserts `value` as `replica`; returns whether it was absent before.
    ///
    /// The insert observes (and replaces) the element's current dots, so a
    /// remove elsewhere that saw only the older dots cannot undo it.
    ///
    /// # Panics
    ///
    /// If `replica` has used every `u64` dot counter.
    #[track_caller]
    pub fn insert(&mut self, replica: ReplicaId, value: T) -> bool {
        let dot = self.store.new_dot(replica);
        self.store.entries.insert(value, vec![dot]).is_none()
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for OrSet<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrSet")
            .field("entries", &self.store.entries)
            .field("ctx", &self.store.ctx)
            .finish()
    }
}

impl<T: Ord + Clone> Merge for OrSet<T> {
    fn merge(&mut self, other: &Self) {
        self.store.merge(&other.store);
    }
}

impl<T: Ord + Clone> DeltaMerge for OrSet<T> {
    type Summary = VersionVector;

    fn version_vector(&self) -> VersionVector {
        self.store.ctx.version_vector()
    }

    fn delta(&self, since: &VersionVector) -> Self {
        Self {
            store: self.store.delta(since),
        }
    }
}

impl<T: Ord + Clone> FromIterator<(ReplicaId, T)> for OrSet<T> {
    /// Inserts each `(replica, value)` in turn.
    fn from_iter<I: IntoIterator<Item = (ReplicaId, T)>>(iter: I) -> Self {
        let mut set = Self::new();
        for (r, v) in iter {
            set.insert(r, v);
        }
        set
    }
}

impl<T: Codec + Ord> Codec for OrSet<T> {
    fn encode(&self, enc: &mut Encoder) {
        self.store.encode(enc);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        DotStore::decode(dec).map(|store| Self { store })
    }
}

impl<T: Codec + Ord> Tagged for OrSet<T> {
    const TAG: u8 = codec::tags::OR_SET;
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ReplicaId = ReplicaId::new(1);
    const B: ReplicaId = ReplicaId::new(2);

    /// Removing and re-inserting an element many times leaves a context of
    /// one range per replica: no tombstones accumulate.
    #[test]
    fn removals_leave_no_tombstones() {
        let mut s = OrSet::new();
        for i in 0..1000 {
            s.insert(A, i % 7);
            s.remove(&(i % 7));
        }
        assert!(s.is_empty());
        assert_eq!(s.context().range_count(), 1);
        assert!(codec::to_bytes(&s).len() < 10);
    }

    /// A delta against a nearly caught-up peer is tiny and merges to the
    /// full state, including a removal the peer had not seen.
    #[test]
    fn delta_is_small_and_exact() {
        let mut x = OrSet::new();
        for i in 0..10_000u32 {
            x.insert(A, i);
        }
        let mut y = x.clone();
        y.insert(B, 10_000);
        y.remove(&5);
        let d = y.delta(&x.version_vector());
        let (full, small) = (codec::to_bytes(&y).len(), codec::to_bytes(&d).len());
        assert!(small * 100 < full, "delta {small} bytes vs state {full}");
        x.merge(&d);
        assert_eq!(x, y);
    }

    /// Decoding rejects a live dot that the context has not seen.
    #[test]
    fn decode_rejects_dot_outside_context() {
        let mut enc = Encoder::new();
        CausalContext::new().encode(&mut enc);
        enc.length(1);
        7u32.encode(&mut enc);
        vec![Dot::new(A, 1)].encode(&mut enc);
        let bytes = enc.into_bytes();
        let err = OrSet::<u32>::decode(&mut Decoder::new(&bytes)).unwrap_err();
        assert!(matches!(err, DecodeError::Invalid { .. }), "{err}");
    }
}
