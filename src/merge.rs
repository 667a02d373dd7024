//! The common interface: [`Merge`] for every state, [`DeltaMerge`] for
//! states that can ship only what a peer is missing.

use crate::causal::VersionVector;

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
    /// A summary of the updates this state includes, for a peer to compute
    /// a delta against.
    fn version_vector(&self) -> VersionVector;

    /// The part of `self` that a replica which has seen `since` lacks.
    ///
    /// `since` must be a version vector of the replica that will merge the
    /// delta (now or earlier); then merging the delta gives exactly the same
    /// state as merging all of `self`.
    fn delta(&self, since: &VersionVector) -> Self;
}
