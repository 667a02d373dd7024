use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Dot, ReplicaId};
use crate::codec::{self, Codec, DecodeError, Decoder, Encoder, Tagged};
use crate::merge::Merge;

/// For each replica, how many of its updates have been seen, contiguously
/// from the first.
///
/// `vv.get(r) == n` means dots `r.1 ..= r.n` have all been seen. Replicas
/// with nothing seen are not stored, so two vectors are equal exactly when
/// they summarise the same events.
///
/// Version vectors are partially ordered ([`PartialOrd`]): `a < b` when `b`
/// has seen everything `a` has and more; neither when they are concurrent.
/// They are also a CRDT themselves: [`Merge`] takes the entry-wise maximum.
///
/// # Examples
///
/// ```
/// use calm::causal::{ReplicaId, VersionVector};
/// use calm::Merge;
///
/// let (a, b) = (ReplicaId::new(1), ReplicaId::new(2));
/// let mut x = VersionVector::new();
/// x.increment(a);
/// let mut y = VersionVector::new();
/// y.increment(b);
/// assert!(x.concurrent(&y));
///
/// x.merge(&y);
/// assert!(x > y);
/// assert_eq!((x.get(a), x.get(b)), (1, 1));
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "BTreeMap<ReplicaId, u64>", into = "BTreeMap<ReplicaId, u64>")]
pub struct VersionVector {
    /// Highest contiguous counter seen per replica; never holds a zero.
    entries: BTreeMap<ReplicaId, u64>,
}

impl VersionVector {
    /// Creates an empty version vector (nothing seen).
    pub fn new() -> Self {
        Self::default()
    }

    /// How many of `replica`'s updates have been seen (0 if none).
    pub fn get(&self, replica: ReplicaId) -> u64 {
        self.entries.get(&replica).copied().unwrap_or(0)
    }

    /// Whether the event `dot` is included: `dot.counter() <= get(replica)`.
    pub fn contains(&self, dot: Dot) -> bool {
        dot.counter() <= self.get(dot.replica())
    }

    /// Records the next event of `replica` and returns its dot.
    ///
    /// # Panics
    ///
    /// If `replica` has already made `u64::MAX` updates.
    #[track_caller]
    pub fn increment(&mut self, replica: ReplicaId) -> Dot {
        let next = self
            .get(replica)
            .checked_add(1)
            .unwrap_or_else(|| counter_overflow());
        self.entries.insert(replica, next);
        Dot::new(replica, next)
    }

    /// Raises `replica`'s entry to at least `counter` (0 does nothing).
    pub fn observe(&mut self, replica: ReplicaId, counter: u64) {
        if counter > 0 {
            let e = self.entries.entry(replica).or_insert(0);
            *e = (*e).max(counter);
        }
    }

    /// Iterates over `(replica, counter)` pairs in replica order, skipping
    /// replicas with nothing seen.
    pub fn iter(&self) -> impl Iterator<Item = (ReplicaId, u64)> + '_ {
        self.entries.iter().map(|(r, c)| (*r, *c))
    }

    /// Whether nothing has been seen.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The total number of events summarised.
    pub fn total(&self) -> u128 {
        self.entries.values().map(|&c| u128::from(c)).sum()
    }

    /// Whether neither vector has seen everything the other has.
    pub fn concurrent(&self, other: &Self) -> bool {
        self.partial_cmp(other).is_none()
    }
}

#[cold]
#[track_caller]
fn counter_overflow() -> ! {
    panic!("a replica made more than u64::MAX updates")
}

impl std::fmt::Debug for VersionVector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.entries.iter()).finish()
    }
}

impl Merge for VersionVector {
    fn merge(&mut self, other: &Self) {
        // Replicas usually know the same set of replicas: then one lockstep
        // walk over both sorted maps updates in place with no lookups.
        let same_keys = self.entries.len() == other.entries.len()
            && self.entries.keys().eq(other.entries.keys());
        if same_keys {
            for ((_, ours), (_, theirs)) in self.entries.iter_mut().zip(&other.entries) {
                *ours = (*ours).max(*theirs);
            }
        } else {
            for (&r, &c) in &other.entries {
                self.observe(r, c);
            }
        }
    }
}

impl PartialOrd for VersionVector {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        let mut less = false; // some entry of self is below other's
        let mut greater = false; // some entry of self is above other's
        let replicas = self.entries.keys().chain(other.entries.keys());
        for &r in replicas {
            match self.get(r).cmp(&other.get(r)) {
                Ordering::Less => less = true,
                Ordering::Greater => greater = true,
                Ordering::Equal => {}
            }
        }
        match (less, greater) {
            (false, false) => Some(Ordering::Equal),
            (true, false) => Some(Ordering::Less),
            (false, true) => Some(Ordering::Greater),
            (true, true) => None,
        }
    }
}

impl From<BTreeMap<ReplicaId, u64>> for VersionVector {
    /// Builds a version vector from a map, dropping zero entries.
    fn from(mut entries: BTreeMap<ReplicaId, u64>) -> Self {
        entries.retain(|_, c| *c > 0);
        Self { entries }
    }
}

impl From<VersionVector> for BTreeMap<ReplicaId, u64> {
    fn from(vv: VersionVector) -> Self {
        vv.entries
    }
}

impl FromIterator<(ReplicaId, u64)> for VersionVector {
    /// Collects pairs, keeping the highest counter per replica and
    /// dropping zeros.
    fn from_iter<I: IntoIterator<Item = (ReplicaId, u64)>>(iter: I) -> Self {
        let mut pairs: Vec<(ReplicaId, u64)> = iter.into_iter().filter(|&(_, c)| c > 0).collect();
        // Sorted by replica, highest counter first within a replica, so
        // `dedup_by_key` keeps the maximum; the map is then built in bulk
        // from sorted input.
        pairs.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        pairs.dedup_by_key(|p| p.0);
        Self {
            entries: pairs.into_iter().collect(),
        }
    }
}

impl Codec for VersionVector {
    fn encode(&self, enc: &mut Encoder) {
        enc.length(self.entries.len());
        for (r, c) in &self.entries {
            r.encode(enc);
            enc.varint(*c);
        }
    }
    fn decode(dec: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        let mut entries = BTreeMap::new();
        let mut bad_zero = None;
        codec::decode_sorted_by_key(
            dec,
            |dec| {
                let offset = dec.offset();
                let pair = (ReplicaId::decode(dec)?, dec.varint()?);
                if pair.1 == 0 {
                    bad_zero.get_or_insert(offset);
                }
                Ok(pair)
            },
            |(r, _)| r,
            |(r, c)| {
                entries.insert(r, c);
            },
        )?;
        if let Some(offset) = bad_zero {
            return Err(DecodeError::Invalid {
                offset,
                what: "version vector entry is zero",
            });
        }
        Ok(Self { entries })
    }
}

impl Tagged for VersionVector {
    const TAG: u8 = codec::tags::VERSION_VECTOR;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vv(pairs: &[(u64, u64)]) -> VersionVector {
        pairs.iter().map(|&(r, c)| (ReplicaId::new(r), c)).collect()
    }

    /// The partial order distinguishes equal, before, after and concurrent.
    #[test]
    fn partial_order() {
        assert_eq!(
            vv(&[(1, 2)]).partial_cmp(&vv(&[(1, 2)])),
            Some(Ordering::Equal)
        );
        assert!(vv(&[(1, 1)]) < vv(&[(1, 2)]));
        assert!(vv(&[(1, 1), (2, 1)]) > vv(&[(1, 1)]));
        assert!(vv(&[(1, 2)]).concurrent(&vv(&[(2, 1)])));
        assert!(VersionVector::new() <= vv(&[]));
    }

    /// Zero entries are never stored, so equality means "same events".
    #[test]
    fn zeros_are_not_stored() {
        assert_eq!(vv(&[(1, 0)]), VersionVector::new());
    }

    /// Decoding rejects a zero entry instead of storing it.
    #[test]
    fn decode_rejects_zero() {
        let mut enc = Encoder::new();
        enc.length(1);
        enc.varint(1);
        enc.varint(0);
        let bytes = enc.into_bytes();
        assert!(matches!(
            VersionVector::decode(&mut Decoder::new(&bytes)),
            Err(DecodeError::Invalid { .. })
        ));
    }
}
