use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::codec::{self, Codec, DecodeError, Decoder, Encoder, Tagged};
use crate::merge::Merge;

/// A grow-only set: elements can be inserted, never removed.
///
/// Merge is set union: commutative, associative, idempotent, so any delivery
/// works. Use it for facts that never become false (ids seen, events
/// processed); for sets that shrink, see [`OrSet`](crate::OrSet).
///
/// # Examples
///
/// ```
/// use calm::{GSet, Merge};
///
/// let mut a = GSet::new();
/// a.insert(1);
/// let mut b = GSet::new();
/// b.insert(2);
/// a.merge(&b);
/// assert!(a.contains(&1) && a.contains(&2));
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
#[serde(bound(deserialize = "T: Ord + Deserialize<'de>"))]
pub struct GSet<T> {
    /// The elements.
    items: BTreeSet<T>,
}

impl<T> Default for GSet<T> {
    fn default() -> Self {
        Self {
            items: BTreeSet::new(),
        }
    }
}

impl<T: Ord> GSet<T> {
    /// Creates an empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts `value`; returns whether it was new.
    pub fn insert(&mut self, value: T) -> bool {
        self.items.insert(value)
    }

    /// Whether `value` is in the set.
    pub fn contains(&self, value: &T) -> bool {
        self.items.contains(value)
    }

    /// The elements in order.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.items.iter()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for GSet<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(&self.items).finish()
    }
}

impl<T: Ord + Clone> Merge for GSet<T> {
    fn merge(&mut self, other: &Self) {
        for v in &other.items {
            if !self.items.contains(v) {
                self.items.insert(v.clone());
            }
        }
    }
}

impl<T: Ord> FromIterator<T> for GSet<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Self {
            items: iter.into_iter().collect(),
        }
    }
}

impl<T: Ord> Extend<T> for GSet<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, iter: I) {
        self.items.extend(iter);
    }
}

impl<T: Codec + Ord> Codec for GSet<T> {
    fn encode(&self, enc: &mut Encoder) {
        self.items.encode(enc);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        BTreeSet::decode(dec).map(|items| Self { items })
    }
}

impl<T: Codec + Ord> Tagged for GSet<T> {
    const TAG: u8 = codec::tags::G_SET;
}
