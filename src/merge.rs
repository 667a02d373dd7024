//! The common interface: [`Merge`] for every state, [`DeltaMerge`] for
//! states that can ship only what a peer is missing.

use std::fmt;

#[cfg(doc)]
use crate::causal::VersionVector;
use crate::codec::Codec;

/// A state that can absorb another replica's state.
///
/// `merge` is the join of a semilattice. Every implementation in calm obeys,
/// and [`calm::testing::laws`](crate::testing) checks:
///
/// - **commutative**: `a ⊔ b == b ⊔ a`;
/// - **associative**: `(a ⊔ b) ⊔ c == a ⊔ (b ⊔ c)`;
/// - **idempotent**: `a ⊔ a == a`;
/// - **monotone**: `a ⊔ b` includes every update of `a` and of `b`, and
///   every local update only moves a state up.
///
/// Together these mean replicas can exchange states in any order, any
/// number of times, over any path, and still end equal once each has
/// (transitively) heard from every other. That is the point: no lock, no
/// leader, no coordination.
///
/// `merge` cannot fail. Untrusted bytes are checked once, where they are
/// decoded ([`codec`](crate::codec)).
///
/// # Examples
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::{GCounter, Merge};
///
/// let (a, b) = (ReplicaId::new(1), ReplicaId::new(2));
/// let mut x = GCounter::new();
/// let mut y = GCounter::new();
/// x.increment(a, 2);
/// y.increment(b, 3);
///
/// let mut xy = x.clone();
/// xy.merge(&y);
/// let mut yx = y.clone();
/// yx.merge(&x);
/// assert_eq!(xy, yx);
/// assert_eq!(xy.value(), 5);
/// ```
pub trait Merge {
    /// Folds `other` into `self`.
    fn merge(&mut self, other: &Self);

    /// Folds `other` into `self`, taking it by value: the way to merge a
    /// state you no longer need, such as a delta just decoded. The result
    /// is [`merge`](Merge::merge)'s; a type may move what `merge` would
    /// copy (a [`Text`](crate::text::Text) merged into a blank replica
    /// becomes it, with no copy).
    ///
    /// ```
    /// use calm::causal::ReplicaId;
    /// use calm::codec;
    /// use calm::text::Text;
    /// use calm::Merge;
    ///
    /// let mut a = Text::new(ReplicaId::new(1));
    /// a.insert(0, "hello")?;
    /// let bytes = codec::to_bytes(&a);
    /// let mut b = Text::new(ReplicaId::new(2));
    /// b.merge_owned(codec::from_bytes(&bytes)?);
    /// assert_eq!(b.to_string(), "hello");
    /// # Ok::<(), calm::Error>(())
    /// ```
    fn merge_owned(&mut self, other: Self)
    where
        Self: Sized,
    {
        self.merge(&other);
    }

    /// Returns the merge of `self` and `other`, leaving both untouched.
    fn merged(&self, other: &Self) -> Self
    where
        Self: Clone,
    {
        let mut out = self.clone();
        out.merge(other);
        out
    }
}

/// A state that records which replica made which update, and can therefore
/// send a peer just what it lacks.
///
/// Delta sync replaces "send the whole state" with a two-step exchange: the
/// receiver sends its [`version_vector`](DeltaMerge::version_vector) (a few
/// bytes per replica), the sender answers with
/// [`delta`](DeltaMerge::delta). The contract:
///
/// ```text
/// a.merge(&b.delta(&a.version_vector()))   gives exactly   a.merge(&b)
/// ```
///
/// and a delta is itself a state no larger than `b` in the lattice order, so
/// merging it anywhere (even into a replica it was not computed for, or
/// twice, or late) is safe: it only ever adds what `b` knew.
///
/// A delta against an older version vector of the receiver is still correct,
/// only larger.
///
/// # Composite states
///
/// A service's state is rarely one CRDT. Tuples (of 1 to 12 states) and
/// `Option` are states themselves, and so is a struct whose fields are
/// states, with `#[derive(Merge, DeltaMerge)]` (feature `derive`):
///
/// - merge is field by field (the product lattice), so the laws hold
///   because they hold for every field;
/// - the summary a peer sends ([`DeltaMerge::Summary`]) is one version
///   vector per field, and a delta is a delta per field. The fields'
///   vectors are *not* joined into one: each field counts updates on its
///   own scale, so a joined vector would tell one field that the peer has
///   updates only another field has, and the delta would leave them out;
/// - `None` is the bottom of `Option<T>`: `None ⊔ x == x`.
///
/// A pair whose counter has moved far ahead of its set still gets
/// exactly the set's new element:
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::{DeltaMerge, Merge, OrSet, PnCounter};
///
/// let (a, b) = (ReplicaId::new(1), ReplicaId::new(2));
/// let mut x: (OrSet<&str>, PnCounter) = Default::default();
/// for _ in 0..50 {
///     x.1.increment(a, 1); // the counter moves far ahead of the set...
/// }
/// x.0.insert(a, "apples");
/// let mut y = x.clone();
/// y.0.insert(b, "bread");
/// y.1.decrement(b, 2);
///
/// let delta = y.delta(&x.version_vector());
/// assert_eq!(delta.0.len(), 1); // only "bread"
/// x.merge(&delta);
/// assert_eq!(x, y);
/// assert_eq!(x.1.value(), 48);
/// ```
///
/// # Examples
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::{DeltaMerge, Merge, OrSet};
///
/// let (a, b) = (ReplicaId::new(1), ReplicaId::new(2));
/// let mut x = OrSet::new();
/// for i in 0..1000 {
///     x.insert(a, i);
/// }
/// let mut y = x.clone();
/// y.insert(b, 1000);
/// y.remove(&7);
///
/// let delta = y.delta(&x.version_vector());
/// assert!(delta.len() < 10); // one new element, not a thousand
/// x.merge(&delta);
/// assert_eq!(x, y);
/// ```
pub trait DeltaMerge: Merge + Sized {
    /// What [`version_vector`](DeltaMerge::version_vector) returns: a
    /// [`VersionVector`] for every calm CRDT; one summary per field for a
    /// composite state (a tuple, an `Option`, a struct with
    /// `#[derive(DeltaMerge)]`).
    ///
    /// Composites cannot fold their fields' vectors into one: each field
    /// counts its replicas' updates on its own scale (a counter's slot, a
    /// set's dots), so the join of two fields' vectors would claim updates
    /// of one field that only the other has. `Default` is "nothing seen",
    /// and [`Merge`] joins what two summaries have seen.
    type Summary: Merge + Codec + Clone + Default + PartialEq + fmt::Debug;

    /// A summary of the updates this state includes, for a peer to compute
    /// a delta against.
    fn version_vector(&self) -> Self::Summary;

    /// The part of `self` that a replica which has seen `since` lacks.
    ///
    /// `since` must be a version vector of the replica that will merge the
    /// delta (now or earlier); then merging the delta gives exactly the same
    /// state as merging all of `self`.
    fn delta(&self, since: &Self::Summary) -> Self;
}

/// Calls `$m!` once per tuple arity calm supports (1 to 12, as far as the
/// standard library's own tuple impls go), with `Type index` pairs, so every
/// tuple impl in the crate (merge, delta, codec, test strategies) is written
/// once.
macro_rules! for_each_tuple {
    ($m:ident) => {
        $m!(1: A 0);
        $m!(2: A 0, B 1);
        $m!(3: A 0, B 1, C 2);
        $m!(4: A 0, B 1, C 2, D 3);
        $m!(5: A 0, B 1, C 2, D 3, E 4);
        $m!(6: A 0, B 1, C 2, D 3, E 4, F 5);
        $m!(7: A 0, B 1, C 2, D 3, E 4, F 5, G 6);
        $m!(8: A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7);
        $m!(9: A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8);
        $m!(10: A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9);
        $m!(11: A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10);
        $m!(12: A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11);
    };
}
pub(crate) use for_each_tuple;

/// A tuple of states is a state: merge, version vector and delta field by
/// field (the product lattice).
macro_rules! tuple_merge {
    ($n:literal: $($t:ident $i:tt),+) => {
        /// Merges field by field: the product of the fields' lattices, so
        /// the laws hold because they hold for every field.
        impl<$($t: Merge),+> Merge for ($($t,)+) {
            fn merge(&mut self, other: &Self) {
                $(self.$i.merge(&other.$i);)+
            }
        }

        /// One version vector (summary) per field, and a delta per field.
        impl<$($t: DeltaMerge),+> DeltaMerge for ($($t,)+) {
            type Summary = ($($t::Summary,)+);

            fn version_vector(&self) -> Self::Summary {
                ($(self.$i.version_vector(),)+)
            }

            fn delta(&self, since: &Self::Summary) -> Self {
                ($(self.$i.delta(&since.$i),)+)
            }
        }
    };
}
for_each_tuple!(tuple_merge);

/// `None` is the bottom: `None ⊔ x == x`, and two `Some`s merge their
/// values. An absent part of a composite state (a cart not created yet)
/// thus joins any replica's present one.
///
/// `None ⊔ Some(x)` is `Some(T::default() ⊔ x)`, which is `Some(x)` for
/// every state (the default is the bottom of its type) and also turns a
/// delta into a full state where the two differ (a [`Text`](crate::Text)
/// delta holds only operations until it is merged into a document).
impl<T: Merge + Default> Merge for Option<T> {
    fn merge(&mut self, other: &Self) {
        if let Some(theirs) = other {
            self.get_or_insert_with(T::default).merge(theirs);
        }
    }
}

/// The value's summary (nothing seen for `None`), and the value's delta.
impl<T: DeltaMerge + Default> DeltaMerge for Option<T> {
    type Summary = T::Summary;

    fn version_vector(&self) -> T::Summary {
        self.as_ref()
            .map(DeltaMerge::version_vector)
            .unwrap_or_default()
    }

    fn delta(&self, since: &T::Summary) -> Self {
        self.as_ref().map(|v| v.delta(since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::causal::ReplicaId;
    use crate::{GCounter, OrSet};

    const A: ReplicaId = ReplicaId::new(1);

    /// A field whose replica counts lag another field's still gets every
    /// update it lacks: the summary is per field, not one joined vector
    /// (which would read `{a: 10}` and skip the set's dots `a.2..=a.4`).
    #[test]
    fn uneven_fields_keep_separate_summaries() {
        let mut x = (GCounter::new(), OrSet::new());
        x.0.increment(A, 10);
        x.1.insert(A, 0u32);
        let mut y = x.clone();
        for i in 1..4 {
            y.1.insert(A, i);
        }
        let delta = y.delta(&x.version_vector());
        assert_eq!(delta.1.len(), 3);
        assert_eq!(delta.0, GCounter::new());
        x.merge(&delta);
        assert_eq!(x, y);
    }

    /// `None` is the bottom of `Option`, from either side.
    #[test]
    fn none_is_the_bottom() {
        let mut some = OrSet::new();
        some.insert(A, 1u8);
        let some = Some(some);
        assert_eq!(None.merged(&some), some);
        assert_eq!(some.merged(&None), some);
        assert_eq!(None::<OrSet<u8>>.version_vector(), Default::default());
        assert_eq!(None::<OrSet<u8>>.delta(&Default::default()), None);
    }
}
