use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::codec::{self, Codec, DecodeError, Decoder, Encoder, Tagged};
use crate::merge::Merge;

/// A set whose removals are final: once removed, an element never comes
/// back, on any replica.
///
/// Contract: merge is commutative, associative and idempotent; any delivery
/// works. A remove wins over every insert of the same element, earlier,
/// concurrent or later. Removed elements are remembered forever (as
/// tombstones) so that late inserts stay removed; if elements must come and
/// go, use [`OrSet`](crate::OrSet).
///
/// # Examples
///
/// ```
/// use calm::{Merge, TwoPhaseSet};
///
/// let mut a = TwoPhaseSet::new();
/// a.insert("session-1");
/// let mut b = a.clone();
/// b.remove(&"session-1");
/// a.insert("session-1"); // too late: it was removed elsewhere
/// a.merge(&b);
/// assert!(!a.contains(&"session-1"));
/// a.insert("session-1");
/// assert!(!a.contains(&"session-1"));
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "TwoPhaseRepr<T>", into = "TwoPhaseRepr<T>")]
#[serde(bound(
    deserialize = "T: Ord + Deserialize<'de>",
    serialize = "T: Ord + Clone + Serialize"
))]
pub struct TwoPhaseSet<T> {
    /// Elements inserted and not removed. Disjoint from `removed`: a removed
    /// element is kept only once, as a tombstone.
    live: BTreeSet<T>,
    /// Tombstones: every element ever removed.
    removed: BTreeSet<T>,
}

/// The serde form of a [`TwoPhaseSet`], checked on the way in.
#[derive(Serialize, Deserialize)]
#[serde(bound(deserialize = "T: Ord + Deserialize<'de>"))]
struct TwoPhaseRepr<T> {
    live: BTreeSet<T>,
    removed: BTreeSet<T>,
}

/// A deserialized [`TwoPhaseSet`] listed an element as both live and removed.
#[derive(Debug, thiserror::Error)]
#[error("an element is both live and removed")]
struct Overlap;

impl<T: Ord> TryFrom<TwoPhaseRepr<T>> for TwoPhaseSet<T> {
    type Error = Overlap;
    fn try_from(r: TwoPhaseRepr<T>) -> Result<Self, Overlap> {
        if r.live.intersection(&r.removed).next().is_some() {
            return Err(Overlap);
        }
        Ok(Self {
            live: r.live,
            removed: r.removed,
        })
    }
}

impl<T> From<TwoPhaseSet<T>> for TwoPhaseRepr<T> {
    fn from(s: TwoPhaseSet<T>) -> Self {
        Self {
            live: s.live,
            removed: s.removed,
        }
    }
}

impl<T> Default for TwoPhaseSet<T> {
    fn default() -> Self {
        Self {
            live: BTreeSet::new(),
            removed: BTreeSet::new(),
        }
    }
}

impl<T: Ord> TwoPhaseSet<T> {
    /// Creates an empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts `value` unless it was ever removed; returns whether it was
    /// added.
    pub fn insert(&mut self, value: T) -> bool {
        !self.removed.contains(&value) && self.live.insert(value)
    }

    /// Removes `value` for good; returns whether it was present.
    ///
    /// Removing an element that is not present does nothing (it cannot be
    /// "pre-removed"), so the tombstone set only holds elements that existed.
    pub fn remove(&mut self, value: &T) -> bool
    where
        T: Clone,
    {
        match self.live.take(value) {
            Some(v) => {
                self.removed.insert(v);
                true
            }
            None => false,
        }
    }

    /// Whether `value` is present.
    pub fn contains(&self, value: &T) -> bool {
        self.live.contains(value)
    }

    /// Whether `value` was removed (and so can never be inserted again).
    pub fn is_removed(&self, value: &T) -> bool {
        self.removed.contains(value)
    }

    /// The present elements in order.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.live.iter()
    }

    /// The number of present elements.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether no element is present.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for TwoPhaseSet<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TwoPhaseSet")
            .field("live", &self.live)
            .field("removed", &self.removed)
            .finish()
    }
}

impl<T: Ord + Clone> Merge for TwoPhaseSet<T> {
    fn merge(&mut self, other: &Self) {
        for v in &other.removed {
            if !self.removed.contains(v) {
                self.live.remove(v);
                self.removed.insert(v.clone());
            }
        }
        for v in &other.live {
            if !self.removed.contains(v) && !self.live.contains(v) {
                self.live.insert(v.clone());
            }
        }
    }
}

impl<T: Codec + Ord> Codec for TwoPhaseSet<T> {
    fn encode(&self, enc: &mut Encoder) {
        self.live.encode(enc);
        self.removed.encode(enc);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let live = BTreeSet::decode(dec)?;
        let removed = BTreeSet::decode(dec)?;
        Self::try_from(TwoPhaseRepr { live, removed })
            .map_err(|_| dec.invalid("an element is both live and removed"))
    }
}

impl<T: Codec + Ord> Tagged for TwoPhaseSet<T> {
    const TAG: u8 = codec::tags::TWO_PHASE_SET;
}
