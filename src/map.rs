//! [`OrMap`]: a map whose values are themselves CRDTs.
//!
//! Keys come and go with observed-remove semantics, like the elements of an
//! [`OrSet`](crate::OrSet); values merge with their own [`Merge`].
//!
//! # Concurrent update and remove
//!
//! Every local update of a key records a *birth*: a fresh [`Dot`] carrying
//! the value as the updating replica now sees it (everything it had merged
//! for that key, plus the update). A remove drops the births it has seen. So
//!
//! - **update wins over a concurrent remove**: the update's birth was not
//!   seen by the remover and survives. The key then holds the updater's
//!   value, which includes what the updater had seen before the remove; the
//!   remove does not subtract anything from it;
//! - **remove then insert on one replica starts fresh**: the old births are
//!   gone, so the key's value starts again from `V::default()`;
//! - **concurrent updates merge**: both births survive, and the key's value
//!   is the merge of their values (two concurrent `+1`s on a counter give
//!   `+2`).
//!
//! Removed keys leave no tombstones: their dots live on only in the causal
//! context's ranges.
//!
//! # Examples
//!
//! ```
//! use calm::causal::ReplicaId;
//! use calm::{Merge, OrMap, PnCounter};
//!
//! let (a, b) = (ReplicaId::new(1), ReplicaId::new(2));
//! let mut x: OrMap<String, PnCounter> = OrMap::new();
//! x.update(a, "likes".to_string(), |c| c.increment(a, 1));
//! let mut y = x.clone();
//!
//! x.update(a, "likes".to_string(), |c| c.increment(a, 1)); // concurrent +1s
//! y.update(b, "likes".to_string(), |c| c.increment(b, 1));
//! y.remove(&"likes".to_string()); // ...and a concurrent remove at y
//!
//! x.merge(&y);
//! // y's own increment was removed with the key at y; x's update wins.
//! assert_eq!(x.get(&"likes".to_string()).unwrap().value(), 2);
//! ```

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::causal::kernel::DotStore;
use crate::causal::{CausalContext, Dot, ReplicaId, VersionVector};
use crate::codec::{self, Codec, DecodeError, Decoder, Encoder, Tagged};
use crate::merge::{DeltaMerge, Merge};

/// An observed-remove map from keys to mergeable values.
///
/// See the [module docs](crate::map) for what concurrent updates and
/// removes do.
///
/// Contract: merge is commutative, associative and idempotent (for any `V`
/// whose own merge is); any delivery works; each replica uses its own
/// [`ReplicaId`]. A key normally holds one birth; after concurrent updates
/// it holds one per concurrent update until the next local update merges
/// them into one.
///
/// # Examples
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::{LwwRegister, Merge, OrMap};
///
/// let a = ReplicaId::new(1);
/// let mut profile: OrMap<&str, LwwRegister<String>> = OrMap::new();
/// profile.update(a, "name", |r| r.set(a, "Ada".into()));
/// assert_eq!(profile.get(&"name").unwrap().get(), "Ada");
/// assert!(profile.remove(&"name"));
/// assert!(profile.get(&"name").is_none());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
#[serde(bound(
    deserialize = "K: Ord + Deserialize<'de>, V: Clone + Deserialize<'de>",
    serialize = "K: Clone + Serialize, V: Clone + Serialize"
))]
pub struct OrMap<K, V> {
    /// Live keys, each with its births: the dot of a local update and the
    /// value that update left. A birth's value never changes after it is
    /// made; a later update makes a new birth.
    store: DotStore<K, (Dot, V)>,
}

impl<K, V> Default for OrMap<K, V> {
    fn default() -> Self {
        Self {
            store: DotStore::default(),
        }
    }
}

impl<K: Ord, V> OrMap<K, V> {
    /// Creates an empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Removes `key` (every update of it this replica has seen); returns
    /// whether it was present.
    pub fn remove(&mut self, key: &K) -> bool {
        self.store.entries.remove(key).is_some()
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &K) -> bool {
        self.store.entries.contains_key(key)
    }

    /// The present keys in order.
    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.store.entries.keys()
    }

    /// The number of present keys.
    pub fn len(&self) -> usize {
        self.store.entries.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.store.entries.is_empty()
    }

    /// Every dot this map has seen.
    pub fn context(&self) -> &CausalContext {
        &self.store.ctx
    }
}

impl<K: Ord + Clone, V: Merge + Clone + Default> OrMap<K, V> {
    /// Updates `key`'s value with `f` as `replica`, inserting
    /// `V::default()` first if the key is absent.
    ///
    /// The key's births are merged into one value, `f` changes it, and the
    /// result becomes the key's single new birth.
    ///
    /// # Panics
    ///
    /// If `replica` has used every `u64` dot counter.
    #[track_caller]
    pub fn update(&mut self, replica: ReplicaId, key: K, f: impl FnOnce(&mut V)) {
        let mut value = match self.store.entries.remove(&key) {
            Some(births) => merge_births(&births).into_owned(),
            None => V::default(),
        };
        f(&mut value);
        let dot = self.store.new_dot(replica);
        self.store.entries.insert(key, vec![(dot, value)]);
    }

    /// Sets `key` to `value` as `replica`, replacing what this replica saw.
    ///
    /// # Panics
    ///
    /// If `replica` has used every `u64` dot counter.
    #[track_caller]
    pub fn insert(&mut self, replica: ReplicaId, key: K, value: V) {
        let dot = self.store.new_dot(replica);
        self.store.entries.insert(key, vec![(dot, value)]);
    }

    /// The value of `key`: borrowed when it has one birth, the merge of its
    /// births after concurrent updates.
    pub fn get(&self, key: &K) -> Option<Cow<'_, V>> {
        self.store.entries.get(key).map(|b| merge_births(b))
    }

    /// The present keys and their values, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, Cow<'_, V>)> + '_ {
        self.store.entries.iter().map(|(k, b)| (k, merge_births(b)))
    }
}

/// The value of a key: its births' values merged (borrowed if just one).
fn merge_births<V: Merge + Clone>(births: &[(Dot, V)]) -> Cow<'_, V> {
    match births {
        [(_, only)] => Cow::Borrowed(only),
        [(_, first), rest @ ..] => {
            let mut v = first.clone();
            for (_, other) in rest {
                v.merge(other);
            }
            Cow::Owned(v)
        }
        // The store never keeps a key without births.
        [] => unreachable!("a live key has at least one birth"),
    }
}

impl<K: std::fmt::Debug, V: std::fmt::Debug> std::fmt::Debug for OrMap<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrMap")
            .field("entries", &self.store.entries)
            .field("ctx", &self.store.ctx)
            .finish()
    }
}

impl<K: Ord + Clone, V: Clone> Merge for OrMap<K, V> {
    fn merge(&mut self, other: &Self) {
        self.store.merge(&other.store);
    }
}

impl<K: Ord + Clone, V: Clone> DeltaMerge for OrMap<K, V> {
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

impl<K: Codec + Ord, V: Codec + Clone> Codec for OrMap<K, V> {
    fn encode(&self, enc: &mut Encoder) {
        self.store.encode(enc);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        DotStore::decode(dec).map(|store| Self { store })
    }
}

impl<K: Codec + Ord, V: Codec + Clone> Tagged for OrMap<K, V> {
    const TAG: u8 = codec::tags::OR_MAP;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PnCounter;

    const A: ReplicaId = ReplicaId::new(1);
    const B: ReplicaId = ReplicaId::new(2);

    /// Removing a key and inserting it again on one replica starts from
    /// the default value.
    #[test]
    fn remove_then_update_starts_fresh() {
        let mut m: OrMap<u8, PnCounter> = OrMap::new();
        m.update(A, 1, |c| c.increment(A, 5));
        m.remove(&1);
        m.update(A, 1, |c| c.increment(A, 1));
        // The counter slot for A continues from the new birth's default.
        assert_eq!(m.get(&1).unwrap().value(), 1);
    }

    /// Concurrent updates keep two births until a local update collapses
    /// them into one.
    #[test]
    fn concurrent_births_collapse_on_update() {
        let mut x: OrMap<u8, PnCounter> = OrMap::new();
        let mut y = x.clone();
        x.update(A, 1, |c| c.increment(A, 1));
        y.update(B, 1, |c| c.increment(B, 1));
        x.merge(&y);
        assert_eq!(x.store.entries[&1].len(), 2);
        assert_eq!(x.get(&1).unwrap().value(), 2);
        x.update(A, 1, |c| c.increment(A, 1));
        assert_eq!(x.store.entries[&1].len(), 1);
        assert_eq!(x.get(&1).unwrap().value(), 3);
    }
}
