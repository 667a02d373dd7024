//! Counters that many replicas update at once: [`GCounter`] (grow-only) and
//! [`PnCounter`] (up and down).
//!
//! Each replica counts its own increments in its own slot; merging takes the
//! maximum per slot and the value is the sum. No increment is ever lost or
//! counted twice, whatever the order, duplication or delay of merges.
//!
//! Both counters support delta sync ([`DeltaMerge`]): a replica's slot only
//! grows, so a peer that reports how far it has seen each slot gets back only
//! the slots that moved since.
//!
//! # Examples
//!
//! Two replicas count page views without talking to each other, then merge:
//!
//! ```
//! use calm::causal::ReplicaId;
//! use calm::{Merge, PnCounter};
//!
//! let (a, b) = (ReplicaId::new(1), ReplicaId::new(2));
//! let mut at_a = PnCounter::new();
//! let mut at_b = PnCounter::new();
//! at_a.increment(a, 10);
//! at_b.decrement(b, 3);
//!
//! at_a.merge(&at_b);
//! at_b.merge(&at_a);
//! assert_eq!(at_a.value(), 7);
//! assert_eq!(at_a, at_b);
//! ```

use serde::{Deserialize, Serialize};

use crate::causal::{ReplicaId, VersionVector};
use crate::codec::{self, Codec, DecodeError, Decoder, Encoder, Tagged};
use crate::merge::{DeltaMerge, Merge};

/// An increment would take one replica's slot past `u64::MAX`.
///
/// Returned by [`GCounter::try_increment`] and its `PnCounter` siblings; the
/// counter is unchanged. Nothing to retry: split the count across replicas
/// or use a wider unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("increment of {by} overflows replica {replica}'s slot (currently {current})")]
#[non_exhaustive]
pub struct CounterOverflow {
    /// The replica whose slot would overflow.
    pub replica: ReplicaId,
    /// Its slot before the increment.
    pub current: u64,
    /// The increment that was refused.
    pub by: u64,
}

/// A grow-only counter.
///
/// Contract: merge is commutative, associative and idempotent, so any
/// delivery works (duplicates, reordering, loss with later retry). Each
/// replica may only increment its *own* slot: two processes sharing a
/// [`ReplicaId`] lose increments.
///
/// The value is the sum of the slots, as a `u128` so it is exact for any
/// number of replicas.
///
/// # Examples
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::{GCounter, Merge};
///
/// let r = ReplicaId::new(1);
/// let mut c = GCounter::new();
/// c.increment(r, 5);
/// let copy = c.clone();
/// c.merge(&copy); // merging twice changes nothing
/// assert_eq!(c.value(), 5);
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GCounter {
    /// Each replica's total increments. A version vector has exactly the
    /// shape and merge (entry-wise max, zeros omitted) a slot map needs, and
    /// doubles as this counter's summary for delta sync.
    slots: VersionVector,
}

impl GCounter {
    /// Creates a counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `by` to `replica`'s slot.
    ///
    /// # Panics
    ///
    /// If the slot would pass `u64::MAX`; use [`GCounter::try_increment`]
    /// to get an error instead.
    #[track_caller]
    pub fn increment(&mut self, replica: ReplicaId, by: u64) {
        if let Err(e) = self.try_increment(replica, by) {
            overflow(e);
        }
    }

    /// Adds `by` to `replica`'s slot, or reports the overflow and changes
    /// nothing.
    ///
    /// # Errors
    ///
    /// [`CounterOverflow`] if the slot would pass `u64::MAX`.
    pub fn try_increment(&mut self, replica: ReplicaId, by: u64) -> Result<(), CounterOverflow> {
        let current = self.slots.get(replica);
        let next = current.checked_add(by).ok_or(CounterOverflow {
            replica,
            current,
            by,
        })?;
        self.slots.observe(replica, next);
        Ok(())
    }

    /// The total of every replica's increments.
    pub fn value(&self) -> u128 {
        self.slots.total()
    }

    /// How much `replica` has added.
    pub fn contribution(&self, replica: ReplicaId) -> u64 {
        self.slots.get(replica)
    }
}

#[cold]
#[track_caller]
fn overflow(e: CounterOverflow) -> ! {
    panic!("{e}")
}

impl std::fmt::Debug for GCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GCounter({} {:?})", self.value(), self.slots)
    }
}

impl Merge for GCounter {
    fn merge(&mut self, other: &Self) {
        self.slots.merge(&other.slots);
    }
}

impl DeltaMerge for GCounter {
    type Summary = VersionVector;

    /// Each replica's slot: slots only grow, so a slot's value orders that
    /// replica's increments exactly as a dot counter would.
    fn version_vector(&self) -> VersionVector {
        self.slots.clone()
    }

    fn delta(&self, since: &VersionVector) -> Self {
        Self {
            slots: self
                .slots
                .iter()
                .filter(|&(r, c)| c > since.get(r))
                .collect(),
        }
    }
}

impl Codec for GCounter {
    fn encode(&self, enc: &mut Encoder) {
        self.slots.encode(enc);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        VersionVector::decode(dec).map(|slots| Self { slots })
    }
}

impl Tagged for GCounter {
    const TAG: u8 = codec::tags::G_COUNTER;
}

/// A counter that goes up and down: two [`GCounter`]s, one for increments
/// and one for decrements.
///
/// Same contract as [`GCounter`]: any delivery order converges, each replica
/// updates only its own slots. The value is exact as an `i128`.
///
/// # Examples
///
/// ```
/// use calm::causal::ReplicaId;
/// use calm::PnCounter;
///
/// let r = ReplicaId::new(1);
/// let mut stock = PnCounter::new();
/// stock.increment(r, 3);
/// stock.decrement(r, 5);
/// assert_eq!(stock.value(), -2);
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PnCounter {
    /// Increments per replica.
    up: GCounter,
    /// Decrements per replica.
    down: GCounter,
}

impl PnCounter {
    /// Creates a counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `by`.
    ///
    /// # Panics
    ///
    /// If `replica`'s increments would pass `u64::MAX` (see
    /// [`PnCounter::try_increment`]).
    #[track_caller]
    pub fn increment(&mut self, replica: ReplicaId, by: u64) {
        self.up.increment(replica, by);
    }

    /// Subtracts `by`.
    ///
    /// # Panics
    ///
    /// If `replica`'s decrements would pass `u64::MAX` (see
    /// [`PnCounter::try_decrement`]).
    #[track_caller]
    pub fn decrement(&mut self, replica: ReplicaId, by: u64) {
        self.down.increment(replica, by);
    }

    /// Adds `by`, or reports the overflow and changes nothing.
    ///
    /// # Errors
    ///
    /// [`CounterOverflow`] if `replica`'s increments would pass `u64::MAX`.
    pub fn try_increment(&mut self, replica: ReplicaId, by: u64) -> Result<(), CounterOverflow> {
        self.up.try_increment(replica, by)
    }

    /// Subtracts `by`, or reports the overflow and changes nothing.
    ///
    /// # Errors
    ///
    /// [`CounterOverflow`] if `replica`'s decrements would pass `u64::MAX`.
    pub fn try_decrement(&mut self, replica: ReplicaId, by: u64) -> Result<(), CounterOverflow> {
        self.down.try_increment(replica, by)
    }

    /// Increments minus decrements.
    pub fn value(&self) -> i128 {
        // Each side is a sum of u64 slots; for fewer than 2^63 replicas both
        // fit in i128 with room to subtract.
        self.up.value() as i128 - self.down.value() as i128
    }
}

impl std::fmt::Debug for PnCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PnCounter({} up {:?} down {:?})",
            self.value(),
            self.up.slots,
            self.down.slots
        )
    }
}

impl Merge for PnCounter {
    fn merge(&mut self, other: &Self) {
        self.up.merge(&other.up);
        self.down.merge(&other.down);
    }
}

impl DeltaMerge for PnCounter {
    type Summary = VersionVector;

    /// Per replica, increments plus decrements. Both only grow and only
    /// that replica moves them, so the sum orders its updates. A sum that
    /// would pass `u64::MAX` saturates, and a saturated entry is always
    /// resent by [`delta`](DeltaMerge::delta), so the delta stays exact.
    fn version_vector(&self) -> VersionVector {
        self.slots()
            .map(|(r, up, down)| (r, up.saturating_add(down)))
            .collect()
    }

    fn delta(&self, since: &VersionVector) -> Self {
        let (mut up, mut down) = (Vec::new(), Vec::new());
        for (r, u, d) in self.slots() {
            let progress = u.saturating_add(d);
            if progress == u64::MAX || progress > since.get(r) {
                up.push((r, u));
                down.push((r, d));
            }
        }
        Self {
            up: GCounter {
                slots: up.into_iter().collect(),
            },
            down: GCounter {
                slots: down.into_iter().collect(),
            },
        }
    }
}

impl PnCounter {
    /// Every replica with a slot, in order, with its increments and
    /// decrements: one merge-join of the two sorted slot maps.
    fn slots(&self) -> impl Iterator<Item = (ReplicaId, u64, u64)> + '_ {
        let (mut up, mut down) = (
            self.up.slots.iter().peekable(),
            self.down.slots.iter().peekable(),
        );
        std::iter::from_fn(move || {
            let r = match (up.peek(), down.peek()) {
                (Some(&(a, _)), Some(&(b, _))) => a.min(b),
                (Some(&(a, _)), None) => a,
                (None, Some(&(b, _))) => b,
                (None, None) => return None,
            };
            let u = up.next_if(|&(x, _)| x == r).map_or(0, |(_, c)| c);
            let d = down.next_if(|&(x, _)| x == r).map_or(0, |(_, c)| c);
            Some((r, u, d))
        })
    }
}

impl Codec for PnCounter {
    fn encode(&self, enc: &mut Encoder) {
        self.up.encode(enc);
        self.down.encode(enc);
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            up: GCounter::decode(dec)?,
            down: GCounter::decode(dec)?,
        })
    }
}

impl Tagged for PnCounter {
    const TAG: u8 = codec::tags::PN_COUNTER;
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ReplicaId = ReplicaId::new(1);
    const B: ReplicaId = ReplicaId::new(2);

    /// An overflowing increment is refused and leaves the counter as it was.
    #[test]
    fn overflow_is_refused_without_change() {
        let mut c = PnCounter::new();
        c.increment(A, u64::MAX - 1);
        let before = c.clone();
        let err = c.try_increment(A, 2).unwrap_err();
        assert_eq!((err.replica, err.current, err.by), (A, u64::MAX - 1, 2));
        assert_eq!(c, before);
        c.increment(B, u64::MAX);
        assert_eq!(c.value(), 2 * u128::from(u64::MAX) as i128 - 1);
    }

    /// A delta only carries slots that moved since the peer's vector.
    #[test]
    fn delta_carries_only_moved_slots() {
        let mut x = PnCounter::new();
        for r in 0..100 {
            x.increment(ReplicaId::new(r), 1);
        }
        let mut y = x.clone();
        y.decrement(B, 4);
        let d = y.delta(&x.version_vector());
        assert_eq!(d.up.slots.iter().count() + d.down.slots.iter().count(), 2);
        x.merge(&d);
        assert_eq!(x, y);
    }

    /// A saturated progress sum is still delivered by deltas.
    #[test]
    fn saturated_progress_is_resent() {
        let mut x = PnCounter::new();
        x.increment(A, u64::MAX);
        x.decrement(A, 1);
        let mut y = x.clone();
        y.decrement(A, 1);
        let d = y.delta(&x.version_vector());
        x.merge(&d);
        assert_eq!(x, y);
    }
}
